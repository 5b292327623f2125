"""The cost-aware router inside a real gateway with two real actors: it polls the actors' KV events, keeps a
session's turns and a shared prompt prefix on the actor that holds them, and reports its figures in Stats. And its
polling against a real server that does not implement KV events: asked again only after a long back-off."""

from __future__ import annotations

import asyncio
import time

import grpc

from forge.gateway.actors import ActorState
from forge.gateway.routing import ActorEndpoint, CostAwareRouter, RouteRequest
from forge.rpc import ServiceBinding, connect, serve
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2, gateway_pb2, gateway_pb2_grpc

from conftest import free_port
from helpers.gateway_fake_actor import FakeActor
from helpers.gateway_procs import start_actor, start_gateway


class CallLog(grpc.ServerInterceptor):
    """The methods a server was asked for, implemented or not."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_service(self, continuation, handler_call_details):
        self.methods.append(handler_call_details.method)
        return continuation(handler_call_details)


def test_the_gateway_routes_by_cached_prefix_and_reports_router_figures(tmp_path):
    actors = [start_actor(tmp_path, f"actor{i}") for i in range(2)]
    gateway = start_gateway(tmp_path, [a.address for a in actors], tmp_path / "pool", name="gateway")
    try:
        stub = gateway_pb2_grpc.GatewayStub(connect(gateway.grpc_address))
        sampling = common_pb2.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        system = [(i * 37) % 1000 for i in range(320)]                  # a long shared system prompt

        def call(session: str, prompt: list[int]) -> tuple[str, list[int]]:
            chunks = list(stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session, prompt_ids=prompt,
                                                                            sampling=sampling), timeout=60))
            return chunks[0].actor, [t for c in chunks for t in c.token_ids]

        def gauges() -> dict[str, float]:
            return dict(stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges)

        first = stub.StartSession(gateway_pb2.StartSessionRequest(task_id="t"), timeout=10).session.session_id
        home, completion = call(first, [*system, 7, 8, 9])
        address = next(a.address for a in actors if a.address.endswith(home.removeprefix("actor-")))
        deadline = time.monotonic() + 20
        while gauges().get(f"router_cached_blocks/{address}", 0) < len(system) // 16:
            assert time.monotonic() < deadline, gauges()
            time.sleep(0.1)
        assert call(first, [*system, 7, 8, 9, *completion, 10, 11])[0] == home       # the session's next turn
        for i in range(3):                                                              # other sessions, same prefix
            other = stub.StartSession(gateway_pb2.StartSessionRequest(task_id=f"o{i}"), timeout=10).session
            assert call(other.session_id, [*system, 20 + i])[0] == home
        figures = gauges()
        assert figures["router_decisions"] == 5 and figures["router_ttft_observed"] == 5
        assert figures[f"router_prefill_tps/{address}"] > 0 and "router_ttft_abs_error_ms" in figures
        report = stub.Stats(common_pb2.StatsRequest(), timeout=10)
        assert report.labels["router"] == "cost-aware+affinity"
    finally:
        gateway.stop()
        for actor in actors:
            actor.stop()


def test_the_router_backs_off_from_an_actor_that_does_not_implement_kv_events():
    calls = CallLog()
    binding = ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, FakeActor("script", [5]), actor_pb2,
                                "Actor")
    server = serve([binding], interceptors=[calls])           # an Actor without KVEventSource (another backend)
    dead = f"127.0.0.1:{free_port()}"                         # nothing listens: UNAVAILABLE, not UNIMPLEMENTED
    clock = [1000.0]

    def polls() -> int:
        return calls.methods.count("/forge.v1.KVEventSource/PollKVEvents")

    async def until(condition, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        actors = [ActorState(ActorEndpoint(server.address)), ActorState(ActorEndpoint(dead))]
        for actor in actors:
            actor.channel = grpc.aio.insecure_channel(actor.endpoint.address)
        router = CostAwareRouter(actors, poll_interval_s=0.01, clock=lambda: clock[0])
        model, down = router.models[server.address], router.models[dead]
        await router.start()
        try:
            await until(lambda: polls() == 1 and not model.events_supported)
            await until(lambda: dead in router._retry_at)
            assert down.events_supported                          # a failed poll is not "unsupported"
            assert router._retry_at[dead] - clock[0] == router.failed_retry_s < router.unsupported_retry_s
            clock[0] += router.unsupported_retry_s - 1
            await asyncio.sleep(0.3)                              # some 30 rounds of polling, within the back-off
            assert polls() == 1
            clock[0] += 2
            await until(lambda: polls() == 2)                     # asked again once it is over
            assert not model.events_supported
            request = RouteRequest("", [1, 2, 3])
            assert router.choose(request, {dead}).address == server.address   # still routed, on load alone
            gauges = router.gauges()                              # and the gauges say which actor is
            assert gauges[f"router_kv_events/{server.address}"] == 0 and gauges[f"router_kv_events/{dead}"] == 1
        finally:
            await router.close()
            for actor in actors:
                await actor.channel.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop(0)
