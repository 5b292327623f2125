"""The policy loss's settings (``[learner.loss]``): which loss (CISPO, PPO-clip, GRPO, GSPO, DAPO, Dr. GRPO, or a
team's own function), its clipping, how its tokens are normalised, the weights of the MTP draft's and the
routers' losses, the reference KL and the correction of the training–inference mismatch. Apart from ``forge.learner.losses`` (torch) so that reading the learner's settings does not import
it."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting

LOSS_KINDS = ("cispo", "ppo", "grpo", "gspo", "dapo", "dr_grpo")
KL_ESTIMATORS = ("k1", "k2", "k3")                  # Schulman's estimators of KL(π ‖ π_ref), forge.learner.reference
CORRECTIONS = ("none", "tis", "mis", "icepop")      # forge.learner.corrections


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
    kl_coef: float = setting(0.0, min=0, help="Weight of the KL penalty toward a frozen reference (the starting "
                                              "checkpoint; with LoRA the base, adapters off), normalised as the "
                                              "policy loss (0 = off).")
    kl_estimator: str = setting("k3", choices=KL_ESTIMATORS,
                                help="The reference KL's per-token estimator (Schulman 2020): k1 = log π − log "
                                     "π_ref, k2 = ½ (log π_ref − log π)², k3 = π_ref/π − 1 − log(π_ref/π).")
    correction: str = setting("none", choices=CORRECTIONS,
                              help="Correct the training–inference mismatch with w = π_learner/π_actor at the "
                                   "sampling version: truncated IS (min(w, tis_cap)), masked IS (w, 0 past "
                                   "mis_cap) or IcePop (w, 0 outside [icepop_low, icepop_high]); the loss's ratio is "
                                   "then taken against the learner's side. See docs/learner.md.")
    correction_level: str = setting("token", choices=("token", "sequence"),
                                    help="TIS and MIS: each token's own w, or its sequence's (the product of its "
                                         "tokens' w); IcePop is token-level.")
    tis_cap: float = setting(2.0, min=0, min_open=True, help="Truncated IS: weights are min(w, tis_cap).")
    mis_cap: float = setting(2.0, min=0, min_open=True, help="Masked IS: tokens (or sequences) whose w exceeds it "
                                                            "are dropped (weight 0).")
    icepop_low: float = setting(0.5, min=0, help="IcePop: tokens whose w lies below it are dropped.")
    icepop_high: float = setting(5.0, min=0, min_open=True, help="IcePop: tokens whose w lies above it are dropped.")
