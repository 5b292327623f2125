"""The rollout driver: issues a workload's tasks in groups of G through the gateway, plays every session with the
workload's agent, and closes each session with its rewards (or its failure), keeping a few groups in flight and
pausing while the learner has enough waiting, and backing off (saying why) while every session fails. Every session
it starts is closed on every exit path: one still in play when the driver stops, or one whose group could not start
in full, is closed as failed with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from forge.rollout.llm import aio_channel
from forge.rollout.workload import Outcome, Plan, Session, Workload, start_request
from forge.v1 import gateway_pb2, gateway_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverConfig:
    gateway: str                               # host:port of the gateway's gRPC service
    http_base: str = ""                        # the gateway's HTTP root (black-box agents get /s/SESSION/v1 on it)
    api_key: str | None = None
    group_size: int = 4
    groups_in_flight: int = 4
    max_queued_groups: int = 0                 # pause issuing while more groups wait for the learner (0 = no limit)


@dataclass
class Backoff:
    """While group after group has every session failed (a broken agent program, a gateway refusing every call),
    the driver waits before the next group: ``first_s``, doubling per failed group up to ``max_s``; a group with a
    session that did not fail resets it."""

    first_s: float = 0.5
    max_s: float = 30.0
    failed_groups: int = 0
    _told: float = 0.0

    def record(self, all_failed: bool) -> None:
        self.failed_groups = self.failed_groups + 1 if all_failed else 0
        if not all_failed:
            self._told = 0.0

    @property
    def delay(self) -> float:
        return min(self.max_s, self.first_s * 2 ** (self.failed_groups - 1)) if self.failed_groups else 0.0

    def news(self) -> bool:
        """Whether the delay grew since it was last told (each doubling is said once)."""
        told, self._told = self._told, self.delay
        return self.delay > told


class RolloutStats:
    def __init__(self, window: int = 64) -> None:
        self.episodes = 0
        self.blackbox = 0
        self.failed = 0
        self.failures: deque[str] = deque(maxlen=8)         # the latest reasons
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))

    def add(self, outcome: Outcome) -> None:
        self.episodes += 1
        self.blackbox += outcome.blackbox
        if outcome.failed:
            self.failed += 1
            self.failures.append(outcome.failed)
        self.recent[outcome.domain].append(outcome.reward)

    def reward(self) -> dict[str, float]:
        return {d: sum(v) / len(v) for d, v in self.recent.items() if v}


def session_of(started: gateway_pb2.StartSessionResponse, http_base: str, driver_key: str | None = None) -> Session:
    session_id = started.session.session_id
    base_url = http_base.rstrip("/") + f"/s/{session_id}/v1" if http_base else ""
    return Session(session_id, started.api_key, base_url, driver_key or "")


async def finish(stub, session_id: str, outcome: Outcome) -> None:
    """Record the session's process rewards and close it with its outcome."""
    for index, reward in outcome.process_rewards.items():
        if index >= 0:
            await stub.AddReward(gateway_pb2.AddRewardRequest(session_id=session_id, call_index=index,
                                                              reward=reward), timeout=60)
    await stub.EndSession(gateway_pb2.EndSessionRequest(
        session_id=session_id, outcome_rewards=outcome.rewards, metrics=outcome.metrics,
        failed=bool(outcome.failed), failure_reason=outcome.failed[:1000]), timeout=60)


STOPPED = "the rollout stopped before the session ended"


async def abandon(stub, session_id: str, reason: str) -> None:
    """Close a session that will not be played to its end as failed; a gateway that cannot close it (gone, or the
    session already closed) is only logged: its session timeout closes what is left."""
    try:
        await stub.EndSession(gateway_pb2.EndSessionRequest(session_id=session_id, failed=True,
                                                            failure_reason=reason), timeout=60)
    except grpc.aio.AioRpcError as exc:
        log.warning("session %s could not be closed (%s): %s", session_id, reason, exc.details())


class RolloutDriver:
    def __init__(self, config: DriverConfig, workload: Workload, on_outcome: Callable[[Outcome], None] | None = None,
                 queued_groups: Callable[[], int] | None = None) -> None:
        """``queued_groups`` tells how many issued groups the learner has not taken yet (for backpressure)."""
        self.config = config
        self.workload = workload
        self.stats = RolloutStats()
        self.on_outcome = on_outcome
        self.queued_groups = queued_groups
        self._group = 0
        self._run_tag = secrets.token_hex(4)    # group ids stay unique when a run directory (and pool) is reused
        self.backoff = Backoff()

    async def run(self, stop: asyncio.Event) -> None:
        async with aio_channel(self.config.gateway, self.config.api_key) as channel:
            await self.drive(gateway_pb2_grpc.GatewayStub(channel), stop)

    async def drive(self, stub, stop: asyncio.Event) -> None:
        """Roll groups out through ``stub`` (the gateway's asyncio stub) until ``stop`` is set."""
        running: set[asyncio.Task] = set()
        while not stop.is_set():
            while len(running) < self.config.groups_in_flight and not self._throttled():
                running.add(asyncio.create_task(self._run_group(stub, self.workload.next_plan())))
            if not running:
                await asyncio.sleep(0.2)
                continue
            done, running = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                if finished.exception() is not None:
                    log.warning("a rollout group failed: %s", finished.exception())
                self.backoff.record(finished.exception() is None and all(o.failed for o in finished.result()))
            if self.backoff.delay:
                await self._pause(stop)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _pause(self, stop: asyncio.Event) -> None:
        """Wait out the back-off (or until stopped), saying why once per doubling."""
        delay = self.backoff.delay
        if self.backoff.news():
            log.warning("every session of the last %d groups failed (the latest: %s); waiting %.1f s before the next",
                        self.backoff.failed_groups, self.stats.failures[-1] if self.stats.failures else "?", delay)
        await self._wait(stop, delay)

    @staticmethod
    async def _wait(stop: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    def _throttled(self) -> bool:
        limit = self.config.max_queued_groups
        return bool(limit and self.queued_groups and self.queued_groups() >= limit)

    async def _run_group(self, stub, plan: Plan) -> list[Outcome]:
        self._group += 1
        group_id = f"{plan.task_id}-{self._run_tag}-g{self._group}"
        request = start_request(plan, group_id, self.config.group_size)
        starts = [asyncio.ensure_future(stub.StartSession(request, timeout=60))
                  for _ in range(self.config.group_size)]
        try:                                    # shielded: a start in flight when the driver stops still answers
            sessions = await asyncio.gather(*map(asyncio.shield, starts))
        except BaseException as exc:            # a start failed, or the driver stops: close those that started
            await asyncio.gather(*starts, return_exceptions=True)
            reason = STOPPED if isinstance(exc, asyncio.CancelledError) else f"its group could not start: {exc}"
            await asyncio.gather(*(abandon(stub, start.result().session.session_id, reason) for start in starts
                                   if not start.cancelled() and start.exception() is None))
            raise
        # return_exceptions: a cancelled gather waits for every session to be closed, not only the first one
        played = await asyncio.gather(*(self._play(stub, plan, started) for started in sessions),
                                      return_exceptions=True)
        failure = next((p for p in played if isinstance(p, BaseException)), None)
        if failure is not None:
            raise failure
        return played

    async def _play(self, stub, plan: Plan, started: gateway_pb2.StartSessionResponse) -> Outcome:
        session = session_of(started, self.config.http_base, self.config.api_key)
        try:
            outcome = await self.workload.play(stub, plan, session)
            await finish(stub, session.session_id, outcome)
        except BaseException as exc:
            reason = STOPPED if isinstance(exc, asyncio.CancelledError) else f"{type(exc).__name__}: {exc}"
            await abandon(stub, session.session_id, reason[:1000])
            raise
        self.stats.add(outcome)
        if self.on_outcome:
            self.on_outcome(outcome)
        return outcome
