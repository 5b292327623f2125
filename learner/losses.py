"""Policy losses over sampled tokens (CISPO; PPO-clip, GRPO, GSPO, DAPO and Dr. GRPO for comparison; a team's own
function) and the MTP draft loss.

All take flat per-token tensors of equal shape: ``logp`` (current policy, with gradient), ``old_logp`` (behaviour
log-probabilities recorded by the actor), ``advantages``, a 0/1 ``mask`` of trained tokens and ``sample_index`` (the
sequence of each token within the micro-batch; a sequence's tokens are all in one micro-batch, linear or packed).
They return the loss already divided by a *global* denominator (tokens, or sequences, summed over every rank), so
that summing gradients over ranks gives the gradient of the whole batch. r = exp(log π − log μ) is a token's ratio.

- CISPO: −Σ sg(clip(r, 1 − ε_low, 1 + ε_high)) · Â · log π / N. The importance weight is clipped and detached,
  never the token's gradient: every token keeps contributing.
- PPO-clip: −Σ min(r · Â, clip(r, 1 − ε, 1 + ε) · Â) / N (token-level normalisation).
- GRPO: the PPO-clip objective averaged within each sequence, then over sequences (no KL term: no reference model).
- GSPO (Zheng et al. 2025), token form: each token's ratio has the value of its sequence's ratio s = exp(mean over
  the sequence's trained tokens of log r) and the gradient of its own log π (s_t = sg(s) · π / sg(π));
  −Σ min(s_t · Â, clip(s_t, 1 − ε_low, 1 + ε_high) · Â), ε of 3e-4 and 4e-4. With an advantage per sequence it is
  GSPO's sequence objective, value and gradient.
- DAPO (Yu et al. 2025): PPO-clip with clip-higher (1 − ε_low, 1 + ε_high; 0.2 and 0.28), always over the
  batch's tokens N. Its soft overlong penalty is a reward (``forge.learner.rewards``), its dynamic sampling a
  batch rule (``forge.learner.dynamic_sampling``).
- Dr. GRPO (Liu et al. 2025): the PPO-clip terms summed over each sequence and divided by a constant, the
  generation budget L (−Σ terms / (S · L), S sequences), or by N when L is 0; no per-sequence length
  normalisation (and no std normalisation of advantages: ``LearnerConfig`` refuses one).

``token_norm="sequence"`` gives CISPO, PPO-clip and GSPO GRPO's weighting instead: each sequence's terms are
averaged, then summed over the global number of sequences, so a one-token answer weighs as much as a long
tool-calling turn (with the default ``"token"`` a batch's long agent calls outweigh its short answers by their
length). A team's own loss (``function``) gets the same tensors and counts (``loss_function``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from forge.learner.loss_config import LossConfig
from forge.loading import PluginError, first_line, load_object


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


def _sequence_sums(values: Tensor, sample_index: Tensor) -> Tensor:
    size = int(sample_index.max()) + 1 if sample_index.numel() else 0
    return torch.zeros(size, dtype=values.dtype, device=values.device).index_add(0, sample_index, values)


def gspo_terms(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, sample_index: Tensor,
               eps_low: float, eps_high: float) -> Tensor:
    """Each token's GSPO-token objective (unmasked): min(s_t · Â, clip(s_t, 1 − ε_low, 1 + ε_high) · Â), where s_t
    has the value of its sequence's ratio (the geometric mean of its trained tokens' ratios) and the gradient of
    its own π."""
    weights = mask.to(logp.dtype)
    log_ratio = _sequence_sums((logp.detach() - old_logp) * weights, sample_index)
    counts = _sequence_sums(weights, sample_index)
    sequence = (log_ratio / counts.clamp(min=1))[sample_index]
    ratio = torch.exp(sequence + logp - logp.detach())
    return torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages)


def gspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, sample_index: Tensor,
              total_tokens: float, total_sequences: float, eps_low: float, eps_high: float,
              token_norm: str = "sequence") -> Tensor:
    """GSPO over the global number of sequences (each sequence's terms averaged: the paper's), or of tokens."""
    terms = gspo_terms(logp, old_logp, advantages, mask, sample_index, eps_low, eps_high)
    if token_norm == "sequence":
        return -sequence_mean(terms, mask, sample_index, total_sequences)
    return -(terms * mask).sum() / total_tokens


def dapo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, total_tokens: float,
              eps_low: float, eps_high: float) -> Tensor:
    """−Σ min(r · Â, clip(r, 1 − ε_low, 1 + ε_high) · Â) / N: clip-higher, over the batch's tokens."""
    ratio = torch.exp(logp - old_logp)
    terms = torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages)
    return -(terms * mask).sum() / total_tokens


def dr_grpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, total_tokens: float,
                 total_sequences: float, eps: float, max_tokens: int) -> Tensor:
    """The PPO-clip terms' sum over the global S sequences times the constant L (``max_tokens``), or over the
    global token count N when L is 0: no sequence's length divides its own terms."""
    denominator = total_sequences * max_tokens if max_tokens > 0 else total_tokens
    return -(_ppo_terms(logp, old_logp, advantages, eps) * mask).sum() / denominator


def policy_loss(config: LossConfig, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                sample_index: Tensor, total_tokens: float, total_sequences: float) -> Tensor:
    if config.function is not None:
        return loss_function(config.function)(logp, old_logp, advantages, mask, sample_index, total_tokens,
                                              total_sequences)
    kind = config.kind
    if kind == "gspo":
        return gspo_loss(logp, old_logp, advantages, mask, sample_index, total_tokens, total_sequences,
                         config.gspo_eps_low, config.gspo_eps_high, config.token_norm)
    if kind == "dapo":
        return dapo_loss(logp, old_logp, advantages, mask, total_tokens, config.dapo_eps_low, config.dapo_eps_high)
    if kind == "dr_grpo":
        return dr_grpo_loss(logp, old_logp, advantages, mask, total_tokens, total_sequences, config.clip_eps,
                            config.dr_grpo_max_tokens)
    if kind != "grpo" and config.token_norm == "sequence":
        terms = (cispo_terms(logp, old_logp, advantages, config.eps_low, config.eps_high) if kind == "cispo"
                 else _ppo_terms(logp, old_logp, advantages, config.clip_eps))
        return -sequence_mean(terms, mask, sample_index, total_sequences)
    if kind == "cispo":
        return cispo_loss(logp, old_logp, advantages, mask, total_tokens, config.eps_low, config.eps_high)
    if kind == "ppo":
        return ppo_loss(logp, old_logp, advantages, mask, total_tokens, config.clip_eps)
    return grpo_loss(logp, old_logp, advantages, mask, sample_index, total_sequences, config.clip_eps)


# ---------------------------------------------------------------------------------------------- a team's own loss

LossFunction = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float, float], Tensor]
_FUNCTIONS: dict[str, LossFunction] = {}
WHAT = "loss function"


def loss_function(spec: str, base_dir: Path | None = None) -> LossFunction:
    """The loss ``spec`` names (``path/to/file.py:name`` relative to ``base_dir``, or ``package.module:name``),
    loaded once per process; ``PluginError`` when it names nothing callable."""
    found = _FUNCTIONS.get(spec)
    if found is None:
        found = load_object(spec, what=WHAT, base_dir=base_dir)
        if isinstance(found, type) or not callable(found):
            raise PluginError(WHAT, spec, f"{type(found).__name__} {getattr(found, '__name__', '')!s} is not a "
                                          "function: name one taking (logp, old_logp, advantages, mask, "
                                          "sample_index, total_tokens, total_sequences)")
        _FUNCTIONS[spec] = found
    return found


def dry_batch(dtype: torch.dtype = torch.float32) -> tuple[Tensor, ...]:
    """A small batch of three sequences, as the learner hands a loss: (logp with gradient, old_logp, advantages,
    mask, sample_index)."""
    generator = torch.Generator().manual_seed(0)
    logp = (-torch.rand(12, generator=generator, dtype=dtype) * 3).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(12, generator=generator, dtype=dtype)
    advantages = torch.tensor([0.5] * 4 + [-1.0] * 5 + [0.25] * 3, dtype=dtype)
    mask = torch.ones(12, dtype=dtype)
    mask[6] = 0.0
    return logp, old, advantages, mask, torch.tensor([0] * 4 + [1] * 5 + [2] * 3)


def check_loss_function(spec: str, base_dir: Path | None = None) -> LossFunction:
    """Load the loss ``spec`` names and run it on a dry batch: it must return a finite scalar tensor whose gradient
    reaches ``logp``, finite. ``PluginError`` (one line) otherwise."""
    function = loss_function(spec, base_dir)
    logp, old, advantages, mask, index = dry_batch()
    try:
        loss = function(logp, old, advantages, mask, index, float(mask.sum()), 3.0)
    except Exception as exc:            # whatever the team's code raised: the run must not start with it
        raise PluginError(WHAT, spec, f"failed on a dry batch: {first_line(exc)}") from exc
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise PluginError(WHAT, spec, f"returned {shape} on a dry batch, not a scalar tensor")
    if not bool(torch.isfinite(loss.detach()).all()):
        raise PluginError(WHAT, spec, f"returned {float(loss.detach())} on a dry batch, not a finite value")
    if not loss.requires_grad:
        raise PluginError(WHAT, spec, "returned a loss without a gradient on a dry batch (detached from logp)")
    loss.reshape(()).backward()
    if logp.grad is None or not bool(torch.isfinite(logp.grad).all()):
        raise PluginError(WHAT, spec, "its gradient does not reach logp, or is not finite, on a dry batch")
    return function


def mtp_topk_kl(target_logits: Tensor, draft_logits: Tensor, top_k: int) -> Tensor:
    """Per-position KL(p_k ‖ q) from the main head's distribution p, restricted to its top-k tokens and
    renormalised (detached), to the draft head's q; rows are positions."""
    target = target_logits.detach().float()
    top = torch.topk(target, min(top_k, target.shape[-1]), dim=-1)
    p = torch.softmax(top.values, dim=-1)
    log_q = torch.log_softmax(draft_logits.float(), dim=-1).gather(-1, top.indices)
    return (p * (torch.log(p.clamp(min=1e-30)) - log_q)).sum(-1)


@torch.no_grad()
def loss_metrics(logp: Tensor, old_logp: Tensor, mask: Tensor, config: LossConfig,
                 sample_index: Tensor | None = None) -> dict[str, float]:
    """Figures about the policy update: mean importance ratio, clipped fraction (for GSPO, of the tokens whose
    sequence ratio is clipped, given ``sample_index``), approximate KL(old ‖ new)."""
    count = mask.sum().clamp(min=1)
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio) * mask
    low, high = {"cispo": (config.eps_low, config.eps_high), "dapo": (config.dapo_eps_low, config.dapo_eps_high),
                 "gspo": (config.gspo_eps_low, config.gspo_eps_high)}.get(config.kind,
                                                                          (config.clip_eps, config.clip_eps))
    clipping = ratio
    if config.kind == "gspo" and sample_index is not None:
        counts = _sequence_sums(mask.to(log_ratio.dtype), sample_index).clamp(min=1)
        clipping = torch.exp(_sequence_sums(log_ratio, sample_index) / counts)[sample_index]
    clipped = ((clipping > 1.0 + high) | (clipping < 1.0 - low)) & (mask > 0)
    return {
        "ratio_mean": float(ratio.sum() / count),
        "clip_frac": float(clipped.sum() / count),
        "approx_kl": float(((torch.exp(log_ratio) - 1) - log_ratio).mul(mask).sum() / count),
    }
