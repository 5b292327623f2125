"""The least-loaded router: the actor with the fewest calls in flight (counted by this gateway)."""

from __future__ import annotations

from forge.gateway.routing.base import ActorEndpoint, RouteRequest, candidates
from forge.gateway.routing.round_robin import RoundRobinRouter


class LeastLoadedRouter(RoundRobinRouter):
    """Fewest in-flight calls (counted by this gateway); ties go round-robin."""

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        allowed = candidates(self.actors, exclude)
        least = min(a.in_flight for a in allowed)
        return self.next_in_turn([a for a in allowed if a.in_flight == least])
