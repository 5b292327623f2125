"""Routers by name or by dotted path: ``router_class`` resolves built-in names and a Router subclass of one's own,
and says clearly why a spec names no router; the gateway builds a router by the constructor contract (wrapped for
session affinity unless it keeps sessions itself). (A real gateway started with ``--router package.module:Class``:
integration/test_router_registry.py.)"""

from __future__ import annotations

import asyncio

import pytest

from forge.gateway.routing import (
    ROUTER_NAMES,
    ActorEndpoint,
    CostAwareRouter,
    KVRouter,
    RoundRobinRouter,
    Router,
    RouteRequest,
    SessionAffinityRouter,
    make_router,
    router_class,
)

from helpers.custom_router import LastHealthyRouter
from helpers.router_views import fleet

SPEC = "helpers.custom_router:LastHealthyRouter"


def test_router_class_resolves_built_in_names_and_dotted_paths():
    assert router_class("cost-aware") is CostAwareRouter and router_class("round-robin") is RoundRobinRouter
    assert all(issubclass(router_class(name), Router) for name in ROUTER_NAMES)
    assert router_class(SPEC) is LastHealthyRouter
    assert router_class("helpers.custom_router.LastHealthyRouter") is LastHealthyRouter
    assert router_class("forge.gateway.routing:RoundRobinRouter") is RoundRobinRouter


@pytest.mark.parametrize(("spec", "reason"), [
    ("random", "unknown router 'random': give one of cost-aware, cache-aware, kv-overlap, round-robin, least-loaded"),
    (":LastHealthyRouter", "unknown router"),
    ("helpers.custom_router:", "unknown router"),
    ("no_such_package.routers:MyRouter",
     "cannot import module 'no_such_package.routers': ModuleNotFoundError: No module named"),
    ("helpers.custom_router:Missing", "module 'helpers.custom_router' has no attribute 'Missing'"),
    ("helpers.custom_router.Missing", "module 'helpers.custom_router' has no attribute 'Missing'"),
    ("helpers.custom_router:NotARouter", "is not a subclass of forge.gateway.routing.Router"),
    ("helpers.custom_router:NOT_A_CLASS", "42 is not a subclass of forge.gateway.routing.Router"),
    ("forge.gateway.routing:KVRouter", "KVRouter is abstract (it does not implement pick)"),
    ("forge.gateway.routing:Router", "Router is abstract (it does not implement choose)"),
])
def test_a_spec_that_names_no_router_is_a_clear_error(spec, reason):
    with pytest.raises(ValueError) as caught:
        router_class(spec)
    message = str(caught.value)
    assert reason in message and repr(spec) in message and "\n" not in message


def test_a_module_that_fails_to_import_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "broken_routers.py").write_text("raise RuntimeError('the router module broke\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as caught:
        router_class("broken_routers:Router")
    assert str(caught.value) == ("router 'broken_routers:Router': cannot import module 'broken_routers': "
                                 "RuntimeError: the router module broke")


def test_the_gateway_builds_a_router_by_the_constructor_contract():
    views = fleet()
    wrapped = make_router(SPEC, views, session_affinity=True)
    assert isinstance(wrapped, SessionAffinityRouter) and isinstance(wrapped.inner, LastHealthyRouter)
    assert wrapped.inner.actors is views and wrapped.inner.session_affinity
    plain = make_router(SPEC, views, session_affinity=False)
    assert isinstance(plain, LastHealthyRouter) and not plain.session_affinity
    kv = make_router("kv-overlap", views, session_affinity=True)
    assert isinstance(kv, KVRouter) and kv.session_affinity            # keeps sessions itself: not wrapped

    request = RouteRequest("s1", [1, 2, 3])
    assert wrapped.choose(request, set()).address == "a2:1"
    views[2].healthy = False
    assert wrapped.choose(request, set()).address == "a1:1"           # its home is down: asked again
    assert wrapped.choose(RouteRequest("s2", [1]), {"a1:1"}).address == "a0:1"
    wrapped.on_first_token(request, "a1:1", 0.01)
    wrapped.on_done(request, "a1:1")
    wrapped.forget("s1")
    asyncio.run(wrapped.start())
    asyncio.run(wrapped.close())
    assert wrapped.gauges() == {"custom_router/choose": 3, "custom_router/on_first_token": 1,
                                "custom_router/on_done": 1, "custom_router/forget": 1, "custom_router/start": 1,
                                "custom_router/close": 1, "custom_router/session_affinity": 1}


def test_the_base_class_defaults_do_nothing():
    class First(Router):
        def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
            return self.actors[0].endpoint

    router = First(fleet(1))
    request = RouteRequest("s", [1])
    assert router.choose(request, set()).address == "a0:1" and router.session_affinity
    router.forget("s")
    router.on_first_token(request, "a0:1", 0.1)
    router.on_done(request, "a0:1")
    asyncio.run(router.start((("authorization", "Bearer k"),)))
    asyncio.run(router.close())
    assert router.gauges() == {}
