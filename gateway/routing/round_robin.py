"""The round-robin router: each call goes to the next actor in turn, skipping those tried or unhealthy."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from forge.gateway.routing.base import ActorEndpoint, ActorView, NoActorAvailable, Router, RouteRequest, candidates


class RoundRobinRouter(Router):
    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True) -> None:
        super().__init__(actors, session_affinity)
        self._turn = itertools.count()

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        return self.next_in_turn(candidates(self.actors, exclude))

    def next_in_turn(self, allowed: Sequence[ActorView]) -> ActorEndpoint:
        """The first of ``allowed`` (never empty) from this call's turn on, in the actors' order."""
        ids = {id(a) for a in allowed}
        start = next(self._turn)
        n = len(self.actors)
        for step in range(n):
            actor = self.actors[(start + step) % n]
            if id(actor) in ids:
                return actor.endpoint
        raise NoActorAvailable("no actor left to try")  # pragma: no cover - candidates is never empty here
