"""The rollout driver closes every session of a group before the group counts as stopped: a session whose agent
takes a while to wind down (a program being killed) is still closed through the live channel, not left open."""

from __future__ import annotations

import asyncio

from forge.rollout.driver import STOPPED, Backoff, DriverConfig, RolloutDriver
from forge.rollout.workload import Outcome, Plan, Workload
from forge.v1 import gateway_pb2, pool_pb2


class RecordingGateway:
    """The driver's side of the gateway's gRPC service, recording what it was asked."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: dict[str, str] = {}

    async def StartSession(self, request, timeout=None):
        session_id = f"s{len(self.started)}"
        self.started.append(session_id)
        return gateway_pb2.StartSessionResponse(session=pool_pb2.SessionRecord(session_id=session_id))

    async def EndSession(self, request, timeout=None):
        self.ended[request.session_id] = request.failure_reason
        return pool_pb2.SessionRecord(session_id=request.session_id)


class SlowToStop(Workload):
    """Session s0 stops at once when cancelled; s1 needs ``release`` set first, as a killed program's pipes take a
    while to close."""

    domains = ("d",)

    def __init__(self) -> None:
        self.playing = asyncio.Event()
        self.release = asyncio.Event()
        self.winding_down = asyncio.Event()
        self.players = 0

    def next_plan(self) -> Plan:
        return Plan("t", "d", {}, blackbox=False)

    async def play(self, stub, plan, session) -> Outcome:
        self.players += 1
        if self.players == 2:
            self.playing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if session.session_id == "s1":
                self.winding_down.set()
                await self.release.wait()
            raise
        raise AssertionError("unreachable")


def test_a_stopped_group_waits_until_every_session_is_closed():
    async def scenario() -> None:
        gateway, workload = RecordingGateway(), SlowToStop()
        driver = RolloutDriver(DriverConfig("unused", group_size=2), workload)
        group = asyncio.create_task(driver._run_group(gateway, workload.next_plan()))
        await workload.playing.wait()
        group.cancel()
        await workload.winding_down.wait()
        for _ in range(20):                     # s0 is closed; the group must not end while s1 winds down
            await asyncio.sleep(0)
        assert gateway.ended == {"s0": STOPPED}
        assert not group.done(), "the group ended with a session still in play"
        workload.release.set()
        await asyncio.gather(group, return_exceptions=True)
        assert group.cancelled()
        assert gateway.ended == {"s0": STOPPED, "s1": STOPPED}

    asyncio.run(scenario())


class FailsButOnce(Workload):
    """Every session fails (a broken agent program) except those of group ``good``."""

    domains = ("d",)

    def __init__(self, good: int) -> None:
        self.good = good
        self.groups = 0

    def next_plan(self) -> Plan:
        self.groups += 1
        return Plan(f"t{self.groups}", "d", self.groups, blackbox=False)

    async def play(self, stub, plan, session) -> Outcome:
        if plan.task == self.good:
            return Outcome("d", rewards={"ok": 1.0})
        return Outcome("d", failed="agent exited with code 1: boom")


def test_groups_whose_sessions_all_fail_are_paced_and_the_driver_says_why(caplog):
    """Back-off counted in groups, not seconds: the pause doubles per failed group, a good group resets it, and
    each longer pause is told once with the latest reason."""
    async def scenario() -> list[float]:
        driver = RolloutDriver(DriverConfig("unused", group_size=2, groups_in_flight=1), FailsButOnce(good=4))
        stop, waits = asyncio.Event(), []

        async def wait(_stop, seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 6:
                stop.set()

        driver._wait = wait
        await driver.drive(RecordingGateway(), stop)
        return waits

    with caplog.at_level("WARNING", logger="forge.rollout.driver"):
        waits = asyncio.run(scenario())
    assert waits == [0.5, 1.0, 2.0, 0.5, 1.0, 2.0]      # group 4 succeeded: no wait after it, and a fresh start
    told = [r.getMessage() for r in caplog.records if "every session" in r.getMessage()]
    assert len(told) == 6 and all("boom" in message for message in told)
    capped, told_at = Backoff(), []
    for group in range(12):
        capped.record(all_failed=True)
        if capped.news():
            told_at.append(group)
    assert capped.delay == capped.max_s and told_at == [0, 1, 2, 3, 4, 5, 6], "a pause at its cap is told once"
