"""What a request must fit before a backend takes it: the model's vocabulary and context, the actor's KV cache and
queue; the checks of a generation, a scoring request and a continuation, each refused with ``InvalidRequest``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from forge.sampling.params import SamplingParams


class LimitedRequest(Protocol):
    """What the checks read of a request (``forge.actors.backend.GenerationRequest``)."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    stream_interval: int
    prefill_only: bool
    continuation: Any
    score_from: int


class InvalidRequest(ValueError):
    """The request cannot be served as given (empty prompt, unknown token ids, too long, bad sampling values)."""


@dataclass(frozen=True)
class RequestLimits:
    """What a request must fit: checked by the engine, and by an engine process's front before it sends one."""

    vocab_size: int
    max_positions: int
    kv_capacity: int                            # tokens the KV cache holds for one request
    eos_token_ids: tuple[int, ...]
    max_in_flight: int                          # running + waiting requests; more are refused (Overloaded)

    def check(self, request: LimitedRequest) -> tuple[int, frozenset[int]]:
        """The request's resolved max tokens and stop ids; raises InvalidRequest with the reason."""
        prompt = request.prompt_ids
        if not prompt:
            raise InvalidRequest("the prompt is empty: give at least one token id")
        vocab = self.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if request.score_from:
            self._check_scoring(request)
            return 0, frozenset()
        if len(prompt) >= self.max_positions:
            raise InvalidRequest(f"the prompt has {len(prompt)} tokens; the model's context is "
                                 f"{self.max_positions}, leaving no room to generate")
        if request.stream_interval < 0:
            raise InvalidRequest(f"stream_interval must be 0 (the engine's) or more, got {request.stream_interval}")
        params = request.params
        bad_stops = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad_stops:
            raise InvalidRequest(f"stop token ids outside the vocabulary: {bad_stops[:5]}")
        bad_bias = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if bad_bias:
            raise InvalidRequest(f"logit_bias token ids outside the vocabulary [0, {vocab}): {bad_bias[:5]}")
        if len(prompt) >= self.kv_capacity:
            raise InvalidRequest(f"the prompt has {len(prompt)} tokens; this actor's KV cache holds {self.kv_capacity}")
        room = min(self.max_positions, self.kv_capacity) - len(prompt)
        if params.min_tokens > room:
            raise InvalidRequest(f"min_tokens is {params.min_tokens}, but the prompt of {len(prompt)} tokens leaves "
                                 f"room for {room}")
        stops = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(self.eos_token_ids))
        max_tokens = min(params.max_tokens or room, room)
        if request.continuation is not None:
            self._check_continuation(request, max_tokens, stops)
        return max_tokens, stops

    def _check_scoring(self, request: LimitedRequest) -> None:
        """A scoring request (``score_from``) scores tokens it is given and samples none."""
        prompt = request.prompt_ids
        if request.score_from >= len(prompt):
            raise InvalidRequest(f"score_from is {request.score_from}, but the prompt has {len(prompt)} tokens: "
                                 f"nothing to score")
        if request.prefill_only or request.continuation is not None:
            raise InvalidRequest("a scoring request (score_from) is served whole, not handed over between actors")
        if len(prompt) > min(self.max_positions, self.kv_capacity):
            raise InvalidRequest(f"the prompt has {len(prompt)} tokens; this actor scores at most "
                                 f"{min(self.max_positions, self.kv_capacity)}")

    def _check_continuation(self, request: LimitedRequest, max_tokens: int, stops: frozenset[int]) -> None:
        given = request.continuation
        if request.prefill_only:
            raise InvalidRequest("a request is prefill_only or a continuation, not both")
        tokens, logprobs = given.token_ids, given.logprobs
        if len(logprobs) != len(tokens):
            raise InvalidRequest(f"a continuation needs one log-probability per token; got {len(tokens)} tokens and "
                                 f"{len(logprobs)} log-probabilities")
        if len(tokens) != 1:
            raise InvalidRequest(f"a continuation carries the one token its prefill sampled, got {len(tokens)}")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(f"continuation token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if not all(math.isfinite(lp) and lp <= 0 for lp in logprobs):
            raise InvalidRequest("continuation log-probabilities must be finite and at most 0")
        if given.weight_version < 0:
            raise InvalidRequest(f"the continuation's weight version must be 0 or more, got {given.weight_version}")
        if len(tokens) >= max_tokens:
            raise InvalidRequest(f"the continuation already has {len(tokens)} tokens of the request's {max_tokens}")
        stopped = [i for i, t in enumerate(tokens) if t in stops]
        if stopped:
            raise InvalidRequest(f"continuation token {stopped[0]} is a stop token: the request had already finished")
