"""The least-loaded router: the actor with the fewest calls in flight (counted by this gateway)."""

from __future__ import annotations

from forge.gateway.routing.base import ActorEndpoint, NoActorAvailable, RouteRequest, candidates
from forge.gateway.routing.round_robin import RoundRobinRouter


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
