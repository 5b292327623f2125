"""Sampling parameters: what a call asks of the draw (temperature, top-k, top-p, penalties, stop ids, a grammar) and
the bounds each keeps, checked wherever parameters are built. Plain Python: the gateway and the rollout drivers build
and check parameters without importing torch; the draw itself is ``forge.sampling.sampling``."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

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
