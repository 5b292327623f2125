"""The cache-aware router (SGLang-style): the actor with the best prefix match if its match rate exceeds
``match_threshold`` and the load is balanced (in-flight spread within both guards), else the least loaded."""

from __future__ import annotations

from collections.abc import Sequence

from forge.gateway.routing.base import ActorView, RouteRequest
from forge.gateway.routing.kv import KVRouter, Option, best_by


class CacheAwareRouter(KVRouter):
    name = "cache-aware"

    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True, *, match_threshold: float = 0.5,
                 balance_abs: int = 4, balance_rel: float = 1.5, **kwargs) -> None:
        super().__init__(actors, session_affinity, **kwargs)
        self.match_threshold = match_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def pick(self, request: RouteRequest, options: list[Option]) -> tuple[Option, str]:
        loads = [o.in_flight for o in options]
        imbalanced = max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads)
        if not imbalanced:
            prompt = max(1, len(request.prompt_ids))
            best = best_by(options, lambda o: (-o.local * o.model.block_size, o.in_flight))
            if best.local * best.model.block_size / prompt > self.match_threshold:
                return best, "prefix"
        return best_by(options, lambda o: o.in_flight), "balance"
