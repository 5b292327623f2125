"""Which actor serves a call. A router sees the call (``RouteRequest``) and the actors' state (``ActorView``: address,
health, the gateway's count of its in-flight calls) and picks one not in ``exclude`` (actors already tried for this
call). Round-robin and least-loaded here; the routers that know where KV prefixes live (cost-aware, cache-aware,
kv-overlap) are in ``forge.gateway.cost_router`` and plug in through the same ``choose``."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class NoActorAvailable(Exception):
    """Every actor is excluded (already tried for this call) or there are none."""


@dataclass(frozen=True)
class ActorEndpoint:
    address: str                # host:port


@dataclass(frozen=True)
class RouteRequest:
    session_id: str
    prompt_ids: Sequence[int]
    max_tokens: int = 0
    group_id: str = ""          # the G rollouts of one prompt share it (cost-aware routers place them together)


class ActorView(Protocol):
    endpoint: ActorEndpoint
    healthy: bool
    in_flight: int


class Router(Protocol):
    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint: ...

    def forget(self, session_id: str) -> None: ...


def candidates(actors: Sequence[ActorView], exclude: set[str]) -> list[ActorView]:
    """Healthy actors not yet tried; if none is healthy, the untried others (they may have recovered)."""
    untried = [a for a in actors if a.endpoint.address not in exclude]
    if not untried:
        raise NoActorAvailable("no actor left to try" if actors else "no actors configured")
    return [a for a in untried if a.healthy] or untried


class RoundRobinRouter:
    def __init__(self, actors: Sequence[ActorView]) -> None:
        self.actors = actors
        self._turn = itertools.count()

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        allowed = {id(a) for a in candidates(self.actors, exclude)}
        start = next(self._turn)
        n = len(self.actors)
        for step in range(n):
            actor = self.actors[(start + step) % n]
            if id(actor) in allowed:
                return actor.endpoint
        raise NoActorAvailable("no actor left to try")  # pragma: no cover - candidates is never empty here

    def forget(self, session_id: str) -> None:
        pass


class LeastLoadedRouter(RoundRobinRouter):
    """Fewest in-flight calls (counted by this gateway); ties go round-robin."""

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        allowed = candidates(self.actors, exclude)
        least = min(a.in_flight for a in allowed)
        tied = {id(a) for a in allowed if a.in_flight == least}
        start = next(self._turn)
        n = len(self.actors)
        for step in range(n):
            actor = self.actors[(start + step) % n]
            if id(actor) in tied:
                return actor.endpoint
        raise NoActorAvailable("no actor left to try")  # pragma: no cover


class SessionAffinityRouter:
    """Keeps a session on the actor that served it (its KV prefix is cached there) while that actor is healthy
    and allowed; otherwise asks the inner router and remembers its answer."""

    def __init__(self, inner: Router, actors: Sequence[ActorView], max_sessions: int = 100_000) -> None:
        self.inner = inner
        self.actors = actors
        self.max_sessions = max_sessions
        self._home: OrderedDict[str, str] = OrderedDict()

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        home = self._home.get(request.session_id)
        if home is not None and home not in exclude:
            actor = next((a for a in self.actors if a.endpoint.address == home), None)
            if actor is not None and actor.healthy:
                self._home.move_to_end(request.session_id)
                return actor.endpoint
        chosen = self.inner.choose(request, exclude)
        if request.session_id:
            self._home[request.session_id] = chosen.address
            self._home.move_to_end(request.session_id)
            while len(self._home) > self.max_sessions:
                self._home.popitem(last=False)
        return chosen

    def forget(self, session_id: str) -> None:
        self._home.pop(session_id, None)
        self.inner.forget(session_id)


ROUTERS = {"round-robin": RoundRobinRouter, "least-loaded": LeastLoadedRouter}
# Routers that know where KV prefixes live (forge.gateway.cost_router); they keep sessions near
# their cache themselves (a preference, never an overload), so SessionAffinityRouter does not wrap them.
KV_ROUTER_NAMES = ("cost-aware", "cache-aware", "kv-overlap")
ROUTER_NAMES = (*KV_ROUTER_NAMES, *ROUTERS)
DEFAULT_ROUTER = "cost-aware"


def make_router(name: str, actors: Sequence[ActorView], session_affinity: bool) -> Router:
    if name in KV_ROUTER_NAMES:
        from forge.gateway.cost_router import KV_ROUTERS

        return KV_ROUTERS[name](actors, session_affinity)
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r} (have {', '.join(ROUTER_NAMES)})")
    router: Router = ROUTERS[name](actors)
    return SessionAffinityRouter(router, actors) if session_affinity else router
