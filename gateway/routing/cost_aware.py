"""The cost-aware router (the default): the least estimated time to first token plus what the call costs later
calls (``CostAwareRouter.score``: the compute it adds, the session's expected further calls times the actor's
measured wait and the chance a pause outlasts its cache horizon, the live blocks it would evict). A new session's
home stays within ``home_cap`` of its share of live sessions; a session stays on its home actor, and the G rollouts
of a group on the actor the first one picked, while that actor is within ``prefer_slack`` of the best and not over
its share cap (never an overload: at most ``share_cap`` times the fair share of the calls in flight, or ``min_cap``
calls)."""

from __future__ import annotations

from collections.abc import Sequence

from forge.gateway.routing.base import ActorView, RouteRequest
from forge.gateway.routing.kv import KVRouter, Option, best_by


class CostAwareRouter(KVRouter):
    name = "cost-aware"

    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True, *, work_weight: float = 0.25,
                 evict_weight: float = 0.5, home_cap: float = 1.25, home_share: str = "kv", **kwargs) -> None:
        super().__init__(actors, session_affinity, **kwargs)
        self.work_weight = work_weight
        self.evict_weight = evict_weight
        self.home_cap = home_cap
        self.home_share = home_share

    def with_room(self, options: list[Option]) -> list[Option]:
        """The actors that may become a new session's home: at most ``home_cap`` times their share of the live
        sessions (shares in proportion to measured prefill speed), so homes, and the calls they bring, spread."""
        total = sum(o.model.sessions for o in options) + 1
        weights = [self.home_weight(o) for o in options]
        whole = sum(weights)
        room = [o for o, weight in zip(options, weights, strict=True)
                if o.model.sessions + 1 <= max(self.min_cap, self.home_cap * total * weight / whole)]
        return room or options

    def home_weight(self, option: Option) -> float:
        if self.home_share == "speed":
            return option.model.prefill_tps.value
        layout = option.model.layout
        return float(layout.num_blocks) if layout and layout.num_blocks else 1.0

    def score(self, option: Option, remaining: float, context_blocks: int) -> float:
        """The estimated time to first token; what the session's ``remaining`` calls would meet there (the
        actor's measured wait per call, and recomputing the session's context when a pause between calls outlasts
        the actor's cache horizon); and what this call costs others: the compute it adds, and the recomputation
        of live sessions' blocks its new blocks would evict."""
        model = option.model
        tps = max(model.prefill_tps.value, 1.0)
        later = self.work_weight * option.compute_tokens + self.evict_weight * option.evicts * model.block_size
        future = model.wait_s.value
        lost = self.gaps.survival(model.horizon_s()) if remaining else 0.0
        if lost:
            per_block = model.block_size / tps
            if model.layout is not None and model.layout.l3:
                per_block = min(per_block, model.layout.block_bytes / max(model.fetch_bps.value, 1.0))
            future += lost * context_blocks * per_block
        return option.estimate_s + remaining * future + later / tps

    def pick(self, request: RouteRequest, options: list[Option]) -> tuple[Option, str]:
        remaining = self.remaining_calls(request.session_id)
        size = options[0].model.block_size
        context = (len(request.prompt_ids) + request.max_tokens) // size
        new = request.session_id and request.session_id not in self.homes
        best = best_by(self.with_room(options) if new else options, lambda o: self.score(o, remaining, context))
        group = self.preferred(self.groups, request.group_id, options, best)
        if group is not None:
            return group, "group"
        home = self.preferred(self.homes, request.session_id if self.session_affinity else "", options, best)
        if home is not None:
            return home, "affinity"
        return best, "cost"
