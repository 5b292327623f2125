"""The policy loss's settings (``[learner.loss]``): which loss (CISPO, PPO-clip, GRPO, GSPO, DAPO, Dr. GRPO, or a
team's own function), its clipping, how its tokens are normalised, and the weights of the MTP draft's and the
routers' losses. Apart from ``forge.learner.losses`` (torch) so that reading the learner's settings does not import
it."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting

LOSS_KINDS = ("cispo", "ppo", "grpo", "gspo", "dapo", "dr_grpo")


@dataclass(frozen=True, kw_only=True)
class LossConfig(Settings):
    kind: str = setting("cispo", flag="loss", choices=LOSS_KINDS,
                        help="Policy loss: CISPO (clipped IS weights, every token's gradient kept), PPO-clip, GRPO, "
                             "GSPO (sequence-level ratio), DAPO (clip-higher, token-level) or Dr. GRPO (no length "
                             "normalisation); see docs/learner.md.")
    function: str | None = setting(None, flag="loss-function", metavar="FILE.py:NAME",
                                   help="A team's own policy loss instead of --loss: NAME(logp, old_logp, advantages, "
                                        "mask, sample_index, total_tokens, total_sequences) returning a scalar tensor "
                                        "(path relative to the run file; checked on a dry batch at start).")
    eps_low: float = setting(1.0, min=0, help="CISPO: the IS weight's lower bound is 1 - eps_low (1: none).")
    eps_high: float = setting(1.0, min=0, help="CISPO: the IS weight's upper bound is 1 + eps_high.")
    clip_eps: float = setting(0.2, min=0, min_open=True, help="PPO-clip, GRPO and Dr. GRPO clipping.")
    gspo_eps_low: float = setting(3e-4, min=0, help="GSPO: the sequence ratio is clipped below at 1 - gspo_eps_low.")
    gspo_eps_high: float = setting(4e-4, min=0, help="GSPO: the sequence ratio is clipped above at 1 + gspo_eps_high.")
    dapo_eps_low: float = setting(0.2, min=0, help="DAPO: the token ratio is clipped below at 1 - dapo_eps_low.")
    dapo_eps_high: float = setting(0.28, min=0, help="DAPO (clip-higher): the token ratio is clipped above at 1 + "
                                                    "dapo_eps_high.")
    dr_grpo_max_tokens: int = setting(0, min=0, help="Dr. GRPO: the constant each sequence's token sum is divided by "
                                                     "(the generation budget; 0: the batch's token count).")
    mtp_weight: float = setting(0.1, min=0, help="Weight of the MTP draft's distillation loss.")
    mtp_top_k: int = setting(32, min=1, help="The MTP draft is distilled toward the main head's top-k distribution.")
    token_norm: str = setting("token", choices=("token", "sequence"),
                              help="CISPO/PPO/GSPO: average over the batch's tokens, or within each sequence then "
                                   "over sequences (GRPO, DAPO and Dr. GRPO have their own).")
    router_balance_weight: float = setting(0.0, min=0, help="Models with experts: weight of the routers' "
                                                            "load-balancing loss (1 at a uniform load; 0 = off).")
