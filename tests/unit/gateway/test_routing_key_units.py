"""Routing and keys without processes: round-robin, least-loaded and session-affine routers, per-session keys, and
the key operation of every gateway gRPC method."""

from __future__ import annotations

import pytest

from forge.gateway.keys import KeyRing
from forge.gateway.routing import (
    ActorEndpoint,
    LeastLoadedRouter,
    NoActorAvailable,
    RoundRobinRouter,
    RouteRequest,
    SessionAffinityRouter,
)
from forge.v1 import gateway_pb2

# ------------------------------------------------------------------------------------------- routing


class Actor:
    def __init__(self, address: str, in_flight: int = 0, healthy: bool = True) -> None:
        self.endpoint, self.in_flight, self.healthy = ActorEndpoint(address), in_flight, healthy


def test_round_robin_and_least_loaded():
    actors = [Actor("a"), Actor("b"), Actor("c")]
    rr = RoundRobinRouter(actors)
    request = RouteRequest("s", [1])
    assert [rr.choose(request, set()).address for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    actors[1].healthy = False
    assert {rr.choose(request, set()).address for _ in range(4)} == {"a", "c"}
    assert rr.choose(request, {"a", "c"}).address == "b"         # the unhealthy one is the last resort
    with pytest.raises(NoActorAvailable):
        rr.choose(request, {"a", "b", "c"})
    actors[1].healthy = True
    actors[0].in_flight, actors[1].in_flight, actors[2].in_flight = 3, 1, 1
    ll = LeastLoadedRouter(actors)
    assert {ll.choose(request, set()).address for _ in range(4)} == {"b", "c"}
    assert ll.choose(request, {"b", "c"}).address == "a"


def test_session_affinity_sticks_until_the_actor_is_unavailable():
    actors = [Actor("a"), Actor("b")]
    router = SessionAffinityRouter(RoundRobinRouter(actors), actors)
    home = router.choose(RouteRequest("s1", [1]), set()).address
    assert all(router.choose(RouteRequest("s1", [1]), set()).address == home for _ in range(5))
    other = router.choose(RouteRequest("s1", [1]), {home}).address
    assert other != home and router.choose(RouteRequest("s1", [1]), set()).address == other
    next(a for a in actors if a.endpoint.address == other).healthy = False
    assert router.choose(RouteRequest("s1", [1]), set()).address == home
    router.forget("s1")
    assert "s1" not in router._home


# ------------------------------------------------------------------------------------------- keys


def test_session_keys_name_their_session_and_cannot_be_forged():
    ring = KeyRing(["global-1"], secret="s3cret")
    key = ring.issue("sess/ü-1")
    assert ring.session_of(key) == "sess/ü-1" and ring.required and ring.is_global("global-1")
    assert not ring.is_global(key) and ring.session_of("global-1") is None
    assert ring.session_of(key[:-2] + "xx") is None and ring.session_of("fsk_!!.x") is None
    assert KeyRing(secret="other").session_of(key) is None
    assert KeyRing(secret="s3cret").session_of(key) == "sess/ü-1"       # same secret: valid after a restart
    assert not KeyRing().required


def test_every_gateway_method_is_an_operation_keys_are_checked_for():
    """A method left out of the map would be checked as reflection (refused to a session's key): each of the
    service's methods names the operation it is."""
    from forge.gateway.auth import Operation
    from forge.gateway.servicer import OPERATIONS, SERVICE

    methods = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods_by_name
    assert set(OPERATIONS) == {f"/{SERVICE}/{name}" for name in methods}
    assert Operation.REFLECTION not in OPERATIONS.values()
    assert OPERATIONS[f"/{SERVICE}/ChatWhole"] == OPERATIONS[f"/{SERVICE}/Chat"] == Operation.CHAT
    assert OPERATIONS[f"/{SERVICE}/GenerateWhole"] == OPERATIONS[f"/{SERVICE}/Generate"] == Operation.GENERATE
