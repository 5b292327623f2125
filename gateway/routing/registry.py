"""Which router ``--router`` names: a built-in one by name, or any ``Router`` subclass by dotted path
(``package.module:ClassName`` or ``package.module.ClassName``); and the factory that builds it for the gateway."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence

from forge.gateway.routing.base import ActorView, Router
from forge.gateway.routing.cache_aware import CacheAwareRouter
from forge.gateway.routing.cost_aware import CostAwareRouter
from forge.gateway.routing.kv_overlap import KVOverlapRouter
from forge.gateway.routing.least_loaded import LeastLoadedRouter
from forge.gateway.routing.round_robin import RoundRobinRouter
from forge.gateway.routing.session_affinity import SessionAffinityRouter

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
    """The router class ``spec`` names: a built-in name (``ROUTER_NAMES``) or a dotted path to a ``Router``
    subclass. Raises ValueError, with a one-line reason, for anything else."""
    if spec in ROUTERS:
        return ROUTERS[spec]
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
    else:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"unknown router {spec!r}: give one of {', '.join(ROUTER_NAMES)}, or a dotted path to a "
                         "Router subclass (package.module:ClassName)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:            # whatever the import raised, the spec names nothing usable
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"router {spec!r}: cannot import module {module_name!r}: {reason}") from exc
    found = getattr(module, attribute, None)
    if found is None:
        raise ValueError(f"router {spec!r}: module {module_name!r} has no attribute {attribute!r}")
    if not (isinstance(found, type) and issubclass(found, Router)):
        raise ValueError(f"router {spec!r}: {found!r} is not a subclass of forge.gateway.routing.Router")
    if inspect.isabstract(found):
        missing = ", ".join(sorted(found.__abstractmethods__))
        raise ValueError(f"router {spec!r}: {found.__qualname__} is abstract (it does not implement {missing})")
    return found


def make_router(spec: str, actors: Sequence[ActorView], session_affinity: bool) -> Router:
    """The gateway's router: ``spec``'s class built as the ``Router`` contract says, in ``SessionAffinityRouter``
    when session affinity is on and the class does not keep sessions itself."""
    cls = router_class(spec)
    router = cls(actors, session_affinity=session_affinity)
    if session_affinity and not cls.handles_session_affinity:
        return SessionAffinityRouter(router, actors)
    return router
