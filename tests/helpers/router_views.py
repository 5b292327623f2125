"""Actor views for router tests: what a router sees of each actor, with nothing behind it."""

from __future__ import annotations

from dataclasses import dataclass

from forge.gateway.routing import ActorEndpoint


@dataclass
class View:
    endpoint: ActorEndpoint
    healthy: bool = True
    in_flight: int = 0


def fleet(n: int = 3) -> list[View]:
    return [View(ActorEndpoint(f"a{i}:1")) for i in range(n)]
