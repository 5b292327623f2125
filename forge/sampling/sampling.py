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

import struct
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from forge.sampling.grammar import Grammar


class SamplingError(ValueError):
    """Sampling parameters out of range."""


# Below MIN_TEMPERATURE, logits / temperature overflow float32 (1e-39 gives inf - inf = NaN log-probabilities);
# 0 means greedy.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 100.0
MAX_TOP_LOGPROBS = 20           # OpenAI's bound on top_logprobs
MAX_PENALTY = 2.0               # OpenAI's (and vLLM's) bound on frequency and presence penalties
MAX_REPETITION_PENALTY = 2.0    # vLLM's bound on the repetition penalty
# Positive logits are divided by the repetition penalty: far below 1 they overflow float32, as with MIN_TEMPERATURE.
MIN_REPETITION_PENALTY = 0.01
MAX_LOGIT_BIAS = 100.0          # OpenAI's bound on a logit bias
# Temperatures travel as protobuf float32: 0.01 arrives as 0.0099999998, which must still be accepted.
_MIN_TEMPERATURE_F32 = struct.unpack("f", struct.pack("f", MIN_TEMPERATURE))[0]
_MIN_REPETITION_PENALTY_F32 = struct.unpack("f", struct.pack("f", MIN_REPETITION_PENALTY))[0]


def repetition_problem(value: float) -> str | None:
    """Why ``value`` cannot be the repetition penalty, or None."""
    if _MIN_REPETITION_PENALTY_F32 <= value <= MAX_REPETITION_PENALTY:
        return None
    return (f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] (1 is no "
            f"penalty), got {value:.8g}")


def temperature_problem(temperature: float) -> str | None:
    """Why ``temperature`` cannot be sampled at, or None."""
    if temperature == 0.0 or _MIN_TEMPERATURE_F32 <= temperature <= MAX_TEMPERATURE:
        return None
    return (f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], "
            f"got {temperature:g}")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 = off
    seed: int | None = None
    max_tokens: int | None = None       # None = up to the context length
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    min_tokens: int = 0                 # stop ids are banned from the first min_tokens tokens
    top_logprobs: int = 0               # report the N most likely tokens of each sampled distribution
    logit_bias: tuple[tuple[int, float], ...] = ()    # (token id, added to its logit), by token id
    frequency_penalty: float = 0.0      # minus this times the token's count in the completion so far
    presence_penalty: float = 0.0       # minus this once the token is in the completion so far
    repetition_penalty: float = 1.0     # tokens of the prompt or the completion: logit / p if > 0, else logit * p
    grammar: Grammar | None = None      # structured output: what the completion must match

    def __post_init__(self) -> None:
        problem = temperature_problem(self.temperature)
        if problem:
            raise SamplingError(problem)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise SamplingError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise SamplingError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.min_tokens < 0:
            raise SamplingError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise SamplingError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise SamplingError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value:g}")
        problem = repetition_problem(self.repetition_penalty)
        if problem:
            raise SamplingError(problem)
        if self.grammar is not None and (self.ignore_eos or self.min_tokens):
            raise SamplingError("ignore_eos and min_tokens cannot be combined with a grammar: once the output is "
                                "complete only the end of sequence may follow")
        ids = [token for token, _ in self.logit_bias]
        if ids != sorted(set(ids)):
            raise SamplingError("logit_bias must list each token id once, in increasing order")
        for token, bias in self.logit_bias:
            if token < 0 or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise SamplingError(f"logit_bias must map token ids >= 0 to values in [-{MAX_LOGIT_BIAS:g}, "
                                    f"{MAX_LOGIT_BIAS:g}], got {token}: {bias:g}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether a token's distribution depends on the tokens before it (penalties or a grammar)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
                    or self.grammar is not None)


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
