"""The policy loss's settings (``[learner.loss]``): which loss (CISPO, PPO-clip, GRPO), its clipping, how its tokens
are normalised, and the weights of the MTP draft's and the routers' losses. Apart from ``forge.learner.losses``
(torch) so that reading the learner's settings does not import it."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting


@dataclass(frozen=True, kw_only=True)
class LossConfig(Settings):
    kind: str = setting("cispo", flag="loss", choices=("cispo", "ppo", "grpo"),
                        help="Policy loss: CISPO (clipped IS weights, every token's gradient kept), PPO-clip or GRPO.")
    eps_low: float = setting(1.0, min=0, help="CISPO: the IS weight's lower bound is 1 - eps_low (1: none).")
    eps_high: float = setting(1.0, min=0, help="CISPO: the IS weight's upper bound is 1 + eps_high.")
    clip_eps: float = setting(0.2, min=0, min_open=True, help="PPO-clip and GRPO clipping.")
    mtp_weight: float = setting(0.1, min=0, help="Weight of the MTP draft's distillation loss.")
    mtp_top_k: int = setting(32, min=1, help="The MTP draft is distilled toward the main head's top-k distribution.")
    token_norm: str = setting("token", choices=("token", "sequence"),
                              help="CISPO/PPO: average over the batch's tokens, or within each sequence then over "
                                   "sequences.")
    router_balance_weight: float = setting(0.0, min=0, help="Models with experts: weight of the routers' "
                                                            "load-balancing loss (1 at a uniform load; 0 = off).")
