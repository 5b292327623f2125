"""The cost-aware router's polling against a real in-process server that does not implement KV events: asked again
only after a long back-off. (Inside a real gateway with real actors: integration/test_router_gateway.py.)"""

from __future__ import annotations

import asyncio

import grpc

from forge.gateway.actors import ActorState
from forge.gateway.routing import ActorEndpoint, CostAwareRouter, RouteRequest
from forge.rpc import ServiceBinding, serve
from forge.v1 import actor_pb2, actor_pb2_grpc

from conftest import free_port
from helpers.gateway_fake_actor import FakeActor
from helpers.method_log import MethodLog
from helpers.waiting import wait_for_async


def test_the_router_backs_off_from_an_actor_that_does_not_implement_kv_events():
    calls = MethodLog()
    binding = ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, FakeActor("script", [5]), actor_pb2,
                                "Actor")
    server = serve([binding], interceptors=[calls])           # an Actor without KVEventSource (another backend)
    dead = f"127.0.0.1:{free_port()}"                         # nothing listens: UNAVAILABLE, not UNIMPLEMENTED
    clock = [1000.0]

    def polls() -> int:
        return calls.methods.count("/forge.v1.KVEventSource/PollKVEvents")

    async def scenario() -> None:
        actors = [ActorState(ActorEndpoint(server.address)), ActorState(ActorEndpoint(dead))]
        for actor in actors:
            actor.channel = grpc.aio.insecure_channel(actor.endpoint.address)
        router = CostAwareRouter(actors, poll_interval_s=0.01, clock=lambda: clock[0])
        model, down = router.models[server.address], router.models[dead]
        await router.start()
        try:
            await wait_for_async(lambda: polls() == 1 and not model.events_supported, "the first poll's answer",
                                 interval_s=0.01)
            await wait_for_async(lambda: dead in router._retry_at, "the dead actor's retry time", interval_s=0.01)
            assert down.events_supported                          # a failed poll is not "unsupported"
            assert router._retry_at[dead] - clock[0] == router.failed_retry_s < router.unsupported_retry_s
            clock[0] += router.unsupported_retry_s - 1
            await asyncio.sleep(0.3)                              # some 30 rounds of polling, within the back-off
            assert polls() == 1
            clock[0] += 2
            await wait_for_async(lambda: polls() == 2, "the second poll", interval_s=0.01)   # once it is over
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
