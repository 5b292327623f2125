"""Policy losses over sampled tokens (CISPO, and PPO-clip and GRPO for comparison) and the MTP draft loss.

All take flat per-token tensors of equal shape: ``logp`` (current policy, with gradient), ``old_logp`` (behaviour
log-probabilities recorded by the actor), ``advantages`` and a 0/1 ``mask`` of trained tokens. They return the
loss already divided by a *global* denominator (tokens, or sequences for GRPO, summed over every rank), so that
summing gradients over ranks gives the gradient of the whole batch.

- CISPO: −Σ sg(clip(r, 1 − ε_low, 1 + ε_high)) · Â · log π / N. The importance weight is clipped and detached,
  never the token's gradient: every token keeps contributing.
- PPO-clip: −Σ min(r · Â, clip(r, 1 − ε, 1 + ε) · Â) / N (token-level normalisation).
- GRPO: the PPO-clip objective averaged within each sequence, then over sequences (no KL term: no reference model).

``token_norm="sequence"`` gives CISPO and PPO-clip GRPO's weighting instead: each sequence's terms are averaged,
then summed over the global number of sequences, so a one-token answer weighs as much as a long tool-calling turn
(with the default ``"token"`` a batch's long agent calls outweigh its short answers by their length).
"""

from __future__ import annotations

import torch
from torch import Tensor

from forge.learner.loss_config import LossConfig


def cispo_terms(logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float | Tensor,
                eps_high: float | Tensor) -> Tensor:
    """Each token's CISPO objective (to maximise, unmasked): sg(clip(r, 1 − ε_low, 1 + ε_high)) · Â · log π."""
    weight = torch.exp(logp.detach() - old_logp).clamp(1.0 - eps_low, 1.0 + eps_high)
    return weight * advantages * logp


def cispo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, total_tokens: float,
               eps_low: float, eps_high: float) -> Tensor:
    return -(cispo_terms(logp, old_logp, advantages, eps_low, eps_high) * mask).sum() / total_tokens


def sequence_mean(terms: Tensor, mask: Tensor, sample_index: Tensor, total_sequences: float) -> Tensor:
    """Σ over sequences (``sample_index``) of the masked mean of their terms, over the global number of sequences."""
    size = int(sample_index.max()) + 1 if sample_index.numel() else 0
    terms = terms * mask
    sums = torch.zeros(size, dtype=terms.dtype, device=terms.device).index_add(0, sample_index, terms)
    counts = torch.zeros(size, dtype=terms.dtype, device=terms.device).index_add(0, sample_index, mask.to(terms))
    return (sums / counts.clamp(min=1)).sum() / total_sequences


def _ppo_terms(logp: Tensor, old_logp: Tensor, advantages: Tensor, eps: float) -> Tensor:
    ratio = torch.exp(logp - old_logp)
    return torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps, 1.0 + eps) * advantages)


def ppo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, total_tokens: float,
             eps: float) -> Tensor:
    return -(_ppo_terms(logp, old_logp, advantages, eps) * mask).sum() / total_tokens


def grpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, sample_index: Tensor,
              total_sequences: float, eps: float) -> Tensor:
    """Each sequence's (``sample_index``) masked mean of the PPO-clip terms, summed, over the global number of
    sequences."""
    return -sequence_mean(_ppo_terms(logp, old_logp, advantages, eps), mask, sample_index, total_sequences)


def policy_loss(config: LossConfig, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                sample_index: Tensor, total_tokens: float, total_sequences: float) -> Tensor:
    if config.kind != "grpo" and config.token_norm == "sequence":
        terms = (cispo_terms(logp, old_logp, advantages, config.eps_low, config.eps_high) if config.kind == "cispo"
                 else _ppo_terms(logp, old_logp, advantages, config.clip_eps))
        return -sequence_mean(terms, mask, sample_index, total_sequences)
    if config.kind == "cispo":
        return cispo_loss(logp, old_logp, advantages, mask, total_tokens, config.eps_low, config.eps_high)
    if config.kind == "ppo":
        return ppo_loss(logp, old_logp, advantages, mask, total_tokens, config.clip_eps)
    return grpo_loss(logp, old_logp, advantages, mask, sample_index, total_sequences, config.clip_eps)


def mtp_topk_kl(target_logits: Tensor, draft_logits: Tensor, top_k: int) -> Tensor:
    """Per-position KL(p_k ‖ q) from the main head's distribution p, restricted to its top-k tokens and
    renormalised (detached), to the draft head's q; rows are positions."""
    target = target_logits.detach().float()
    top = torch.topk(target, min(top_k, target.shape[-1]), dim=-1)
    p = torch.softmax(top.values, dim=-1)
    log_q = torch.log_softmax(draft_logits.float(), dim=-1).gather(-1, top.indices)
    return (p * (torch.log(p.clamp(min=1e-30)) - log_q)).sum(-1)


@torch.no_grad()
def loss_metrics(logp: Tensor, old_logp: Tensor, mask: Tensor, config: LossConfig) -> dict[str, float]:
    """Figures about the policy update: mean importance ratio, clipped fraction, approximate KL(old ‖ new)."""
    count = mask.sum().clamp(min=1)
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio) * mask
    if config.kind == "cispo":
        clipped = ((ratio > 1.0 + config.eps_high) | (ratio < 1.0 - config.eps_low)) & (mask > 0)
    else:
        clipped = ((ratio > 1.0 + config.clip_eps) | (ratio < 1.0 - config.clip_eps)) & (mask > 0)
    return {
        "ratio_mean": float(ratio.sum() / count),
        "clip_frac": float(clipped.sum() / count),
        "approx_kl": float(((torch.exp(log_ratio) - 1) - log_ratio).mul(mask).sum() / count),
    }
