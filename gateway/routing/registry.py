"""Which router ``--router`` names: a built-in one by name, or any ``Router`` subclass by dotted path
(``package.module:ClassName`` or ``package.module.ClassName``) or file (``path/to/file.py:ClassName``); and the
factory that builds it for the gateway."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from forge.gateway.routing.base import ActorView, Router
from forge.gateway.routing.cache_aware import CacheAwareRouter
from forge.gateway.routing.cost_aware import CostAwareRouter
from forge.gateway.routing.kv_overlap import KVOverlapRouter
from forge.gateway.routing.least_loaded import LeastLoadedRouter
from forge.gateway.routing.round_robin import RoundRobinRouter
from forge.gateway.routing.session_affinity import SessionAffinityRouter
from forge.loading import PluginError, load_object

ROUTERS: dict[str, type[Router]] = {
    "cost-aware": CostAwareRouter,
    "cache-aware": CacheAwareRouter,
    "kv-overlap": KVOverlapRouter,
    "round-robin": RoundRobinRouter,
    "least-loaded": LeastLoadedRouter,
}
ROUTER_NAMES = tuple(ROUTERS)
DEFAULT_ROUTER = "cost-aware"


def router_class(spec: str) -> type[Router]:
    """The router class ``spec`` names: a built-in name (``ROUTER_NAMES``) or a path to a ``Router`` subclass
    (``package.module:ClassName``, ``package.module.ClassName`` or ``path/to/file.py:ClassName``, loaded by
    ``forge.loading.load_object``). Raises ``PluginError`` (a ValueError), with a one-line reason, for anything
    else."""
    if spec in ROUTERS:
        return ROUTERS[spec]
    if ":" in spec:
        module_name, _, attribute = spec.rpartition(":")
    else:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise PluginError("unknown router", spec, f"give one of {', '.join(ROUTER_NAMES)}, or a dotted path to a "
                                                  "Router subclass (package.module:ClassName)")
    try:
        found = load_object(f"{module_name}:{attribute}", what="router")
    except PluginError as exc:                  # said of the spec as given, with or without its colon
        raise PluginError("router", spec, exc.reason) from exc
    if not (isinstance(found, type) and issubclass(found, Router)):
        raise PluginError("router", spec, f"{found!r} is not a subclass of forge.gateway.routing.Router")
    if inspect.isabstract(found):
        missing = ", ".join(sorted(found.__abstractmethods__))
        raise PluginError("router", spec, f"{found.__qualname__} is abstract (it does not implement {missing})")
    return found


def make_router(spec: str, actors: Sequence[ActorView], session_affinity: bool) -> Router:
    """The gateway's router: ``spec``'s class built as the ``Router`` contract says, in ``SessionAffinityRouter``
    when session affinity is on and the class does not keep sessions itself."""
    cls = router_class(spec)
    router = cls(actors, session_affinity=session_affinity)
    if session_affinity and not cls.handles_session_affinity:
        return SessionAffinityRouter(router, actors)
    return router
