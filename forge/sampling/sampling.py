"""Sampling: the distribution a token is drawn from (temperature, top-k, top-p) and its log-probabilities.

The log-probability recorded for a sampled token is taken under exactly the distribution it was drawn from (after
temperature and truncation), so the learner can recompute it with the same parameters. Greedy decoding
(temperature 0) records the log-probability of the argmax token under the untempered softmax.

``min_tokens`` bans the request's stop ids and the model's end-of-sequence ids (even with ``ignore_eos``) from its
first ``min_tokens`` tokens: their logits are -inf before temperature and truncation, as vLLM's min-tokens processor
does, so the distribution a token is drawn from, and the log-probability recorded for it, is the one without them
(the learner leaves the same ids out of the same tokens).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


def sampling_logprobs(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probabilities [N, V] of the distribution tokens are drawn from; -inf outside its support.

    Greedy (temperature 0) gives the untempered log-softmax (its argmax is the token taken)."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p          # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def sample(logprobs: Tensor, greedy: bool, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Draw one token per row from ``logprobs`` [N, V]; returns (token ids [N], their log-probabilities [N])."""
    if greedy:
        tokens = logprobs.argmax(-1)
    else:
        tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def top_logprobs(logprobs: Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The ``k`` most likely token ids of each row of ``logprobs`` [N, V] with their log-probabilities, most likely
    first; tokens outside the distribution's support (-inf) are left out."""
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    out_ids, out_values = [], []
    for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True):
        kept = [i for i, v in enumerate(row_values) if v != float("-inf")]
        out_ids.append([row_ids[i] for i in kept])
        out_values.append([row_values[i] for i in kept])
    return out_ids, out_values


class Edits(Protocol):
    """Edits of a batch's logits before temperature and truncation (``forge.sampling.logit_edits.LogitEdits``)."""

    def apply(self, logits: Tensor) -> Tensor: ...


def batched_sampling_logprobs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor,
                              truncates: tuple[bool, bool] | None = None,
                              edits: Edits | None = None) -> Tensor:
    """``sampling_logprobs`` with per-row parameters ([N] tensors; temperature 0 = greedy, top_k 0 = off).
    ``truncates`` — whether any row has top-k on, whether any has top-p < 1 — spares a device sync per call when the
    caller knows it on the host (a True that could be False only costs a sort). ``edits`` (min_tokens, a grammar,
    logit_bias, penalties: see ``forge.sampling.logit_edits``) come before temperature and truncation."""
    logits = logits.float()
    if edits is not None:
        logits = edits.apply(logits)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(logits)
    logits = logits / scale.unsqueeze(-1)
    vocab = logits.shape[-1]
    truncate_k = (top_k > 0) & (top_k < vocab)
    truncate_p = top_p < 1.0
    any_k, any_p = truncates if truncates is not None else (bool(truncate_k.any()), bool(truncate_p.any()))
    if any_k or any_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        k = torch.where(truncate_k, top_k, torch.full_like(top_k, vocab)).clamp(1, vocab).to(order.device)
        kth = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
        drop_sorted = sorted_logits < kth
        if any_p:
            probs = sorted_logits.masked_fill(drop_sorted, float("-inf")).softmax(-1)
            mass_before = probs.cumsum(-1) - probs
            drop_sorted |= mass_before >= top_p.to(probs).unsqueeze(-1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)
