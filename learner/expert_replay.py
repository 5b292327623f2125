"""How the learner routes the tokens of a model with experts, and what it reports of it.

``--routing replay`` (the default) trains every token through the experts its actor chose (the routing recorded in
the pool), so that the learner's log-probabilities are the rollout's even where the routers' choice is fragile
(another batch, kernel or weight version moves a near tie); the router's weights still come from its current
probabilities at those experts, so the routers keep learning. ``--routing recompute`` lets the routers choose
again. Either way the step reports the mismatch rate: the share of recorded tokens whose routers, left alone,
choose other experts in some layer. It also reports the load-balancing loss (trained with weight
``--router-balance-weight``) and the expert load: how unevenly the routed slots spread over each layer's experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from forge.model.moe import Routing, expert_load, load_balancing_loss
from forge.model.qwen3 import CausalLM


def routing_for(model: CausalLM, recorded: Tensor | None, mode: str, keep_logits: bool) -> Routing | None:
    """The Routing of one forward pass over tokens whose recorded routing is ``recorded`` [layers, tokens, k]
    (-1 where none): None for a dense model."""
    if not model.config.sparse_layers:
        return None
    return Routing(replay=recorded, apply=mode == "replay", record=True, keep_logits=keep_logits)


@dataclass
class RoutingTally:
    """A step's routing figures, summed over its forward passes (this rank's)."""

    num_experts: int
    top_k: int
    differs: int = 0
    given: int = 0
    counts: Tensor | None = None            # [layers, experts] routed slots
    balance: list[float] = field(default_factory=list)

    def add(self, routing: Routing | None, tokens: Tensor | None = None) -> None:
        """The figures of one pass; ``tokens``: its rows that are real tokens (padding left out)."""
        if routing is None or not routing.chosen:
            return
        differs, given = routing.mismatches(tokens)
        self.differs += differs
        self.given += given
        chosen = routing.stack()
        if tokens is not None:
            chosen = chosen[:, tokens]
        counts = expert_load(chosen, self.num_experts).cpu()
        self.counts = counts if self.counts is None else self.counts + counts

    def balance_loss(self, routing: Routing | None, tokens: Tensor | None = None) -> Tensor | None:
        """The load-balancing loss of one pass (its router logits kept), or None."""
        if routing is None or not routing.logits:
            return None
        loss = load_balancing_loss(routing.logits, self.top_k, tokens)
        self.balance.append(float(loss.detach()))
        return loss

    def figures(self, total: dict[str, float]) -> dict[str, float]:
        """The step's record entries from the tallies summed over ranks (``total``, see ``sums``)."""
        if not total.get("slots"):
            return {}
        figures = {"routing_mismatch": total["differs"] / total["given"] if total["given"] else 0.0,
                   "routing_recorded_share": total["given"] / total["tokens"] if total["tokens"] else 0.0,
                   "expert_load_max": total["load_max"]}
        if total.get("balance_n"):
            figures["router_balance_loss"] = total["balance"] / total["balance_n"]
        return figures

    def sums(self) -> dict[str, float]:
        """What ``figures`` needs from this rank, to be summed over ranks (``load_max``, the mean over layers of the
        busiest expert's load over the mean load, is then averaged over ranks)."""
        counts = self.counts if self.counts is not None else torch.zeros(1, self.num_experts)
        slots = float(counts.sum())
        tokens = slots / max(1, counts.shape[0] * self.top_k)
        per_layer = counts.float()
        mean = per_layer.sum(-1, keepdim=True) / self.num_experts
        load_max = float((per_layer / mean.clamp(min=1e-9)).max(-1).values.mean()) if slots else 0.0
        return {"differs": float(self.differs), "given": float(self.given), "slots": slots, "tokens": tokens,
                "load_max": load_max, "balance": float(sum(self.balance)), "balance_n": float(len(self.balance))}
