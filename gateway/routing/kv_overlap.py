"""The kv-overlap router (Dynamo-style): the least α · (prompt blocks to compute) + (blocks of calls in flight
there)."""

from __future__ import annotations

from collections.abc import Sequence

from forge.gateway.routing.base import ActorView, RouteRequest
from forge.gateway.routing.kv import KVRouter, Option, best_by


class KVOverlapRouter(KVRouter):
    name = "kv-overlap"

    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True, *, alpha: float = 1.0,
                 **kwargs) -> None:
        super().__init__(actors, session_affinity, **kwargs)
        self.alpha = alpha

    def pick(self, request: RouteRequest, options: list[Option]) -> tuple[Option, str]:
        def cost(o: Option) -> float:
            to_compute = -(-len(request.prompt_ids) // o.model.block_size) - o.local
            return self.alpha * to_compute + o.model.active_blocks

        return best_by(options, cost), "overlap"
