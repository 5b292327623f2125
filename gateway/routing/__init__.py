"""Which actor serves a call. Every router is a subclass of ``Router`` (``base``), the one interface the gateway
calls; ``--router`` names one of the built-in routers or any subclass by dotted path (``registry``).

- ``round_robin``, ``least_loaded``: in turn, or the fewest calls in flight; ``session_affinity`` wraps them to
  keep a session on the actor that served it;
- ``kv``: the shared base of the routers that know where KV prefixes live, on the model of the actors in
  ``fleet``; ``cost_aware`` (the default), ``cache_aware`` and ``kv_overlap`` are its policies.

See docs/gateway.md (writing your own router) and docs/cache.md (the KV-aware routers).
"""

from forge.gateway.routing.base import (
    ActorEndpoint,
    ActorView,
    NoActorAvailable,
    Router,
    RouteRequest,
    candidates,
)
from forge.gateway.routing.cache_aware import CacheAwareRouter
from forge.gateway.routing.cost_aware import CostAwareRouter
from forge.gateway.routing.kv import KVRouter
from forge.gateway.routing.kv_overlap import KVOverlapRouter
from forge.gateway.routing.least_loaded import LeastLoadedRouter
from forge.gateway.routing.registry import DEFAULT_ROUTER, ROUTER_NAMES, ROUTERS, make_router, router_class
from forge.gateway.routing.round_robin import RoundRobinRouter
from forge.gateway.routing.session_affinity import SessionAffinityRouter

__all__ = [
    "DEFAULT_ROUTER",
    "ROUTERS",
    "ROUTER_NAMES",
    "ActorEndpoint",
    "ActorView",
    "CacheAwareRouter",
    "CostAwareRouter",
    "KVOverlapRouter",
    "KVRouter",
    "LeastLoadedRouter",
    "NoActorAvailable",
    "RoundRobinRouter",
    "RouteRequest",
    "Router",
    "SessionAffinityRouter",
    "candidates",
    "make_router",
    "router_class",
]
