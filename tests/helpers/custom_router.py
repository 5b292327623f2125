"""A router of one's own, loaded by dotted path (``--router helpers.custom_router:LastHealthyRouter``), and things
that are not routers, for the errors of ``router_class``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from forge.gateway.routing import ActorEndpoint, ActorView, NoActorAvailable, Router, RouteRequest

NOT_A_CLASS = 42


class NotARouter:
    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        raise NoActorAvailable("never")


class LastHealthyRouter(Router):
    """Always the last healthy actor not yet tried (the last untried one when none is healthy); counts every call
    the gateway makes to it and reports the counts as gauges (``custom_router/<method>``)."""

    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True) -> None:
        super().__init__(actors, session_affinity)
        self.calls: Counter[str] = Counter()

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        self.calls["choose"] += 1
        untried = [a for a in self.actors if a.endpoint.address not in exclude]
        if not untried:
            raise NoActorAvailable("no actor left to try")
        return ([a for a in untried if a.healthy] or untried)[-1].endpoint

    def forget(self, session_id: str) -> None:
        self.calls["forget"] += 1

    async def start(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.calls["start"] += 1

    async def close(self) -> None:
        self.calls["close"] += 1

    def on_first_token(self, request: RouteRequest, address: str, ttft_s: float) -> None:
        self.calls["on_first_token"] += 1

    def on_done(self, request: RouteRequest, address: str) -> None:
        self.calls["on_done"] += 1

    def gauges(self) -> dict[str, float]:
        figures = {f"custom_router/{method}": float(n) for method, n in self.calls.items()}
        figures["custom_router/session_affinity"] = float(self.session_affinity)
        return figures
