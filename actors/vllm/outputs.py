"""vLLM's requests and outputs in Forge's terms: sampling parameters as vLLM's keyword arguments, its outputs as
token chunks (log-probabilities, expert routing, timings), and the engine figures its stat logger records.

The log-probabilities are vLLM's ``processed_logprobs``: those of the distribution the token was drawn from, after
every edit of the logits, in the order ``forge.sampling.logit_edits`` describes and the learner replays: the grammar's
mask and ``min_tokens`` (stop and end-of-sequence ids banned), ``logit_bias``, the repetition penalty (over prompt
and output tokens), the frequency and presence penalties (over output tokens); then temperature, top-k and top-p.
``top_logprobs`` come from the same processed log-probs. Structured output goes to vLLM's ``guidance`` backend as
the Lark text ``forge.sampling.grammar.Grammar.lark()`` gives (JSON layout included), the grammar the torch engine and
the learner compile, so vLLM masks exactly as they do. It needs vLLM's tokenizer, which is loaded from the checkpoint's
``tokenizer.json`` where it gives the same masks as Forge's grammars (a fast tokenizer, no larger than the model's
vocabulary, whose end-of-sequence id is the model's only one: llguidance lets a complete document end with the
tokenizer's end of sequence alone); elsewhere vLLM runs without a tokenizer and structured output is refused."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from forge.actors.backend import FinishReason, RoutedExperts, TokenChunk

VLLM_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def sampling_kwargs(params, max_tokens: int, stops: frozenset[int]) -> dict[str, Any]:
    """Our sampling parameters (resolved max tokens and stop ids) as vLLM ``SamplingParams`` keyword arguments."""
    # ignore_eos: the end-of-sequence ids come in ``stops`` (unless the request ignores them); vLLM still bans them
    # from the first min_tokens tokens, as the torch engine does.
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "logprobs": params.top_logprobs, "detokenize": False,
                              "stop_token_ids": sorted(stops), "ignore_eos": True, "seed": params.seed,
                              "min_tokens": params.min_tokens, "logit_bias": dict(params.logit_bias) or None,
                              "frequency_penalty": params.frequency_penalty,
                              "presence_penalty": params.presence_penalty,
                              "repetition_penalty": params.repetition_penalty}
    if params.grammar is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kwargs["structured_outputs"] = StructuredOutputsParams(grammar=params.grammar.lark())
    if params.greedy:
        kwargs.update(temperature=0.0)
    else:
        kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0)
    return kwargs


def chunk_of(completion: Any, version: int, top_logprobs: int = 0) -> TokenChunk:
    """The delta of one streamed ``CompletionOutput`` as a chunk stamped with ``version``; with ``top_logprobs``,
    each token's most likely alternatives (vLLM's processed log-probs, ranked)."""
    tokens = list(completion.token_ids)
    entries = list(completion.logprobs or [])
    logprobs = [float(entry[token].logprob) for entry, token in zip(entries, tokens, strict=True)]
    chunk = TokenChunk(tokens, logprobs, [version] * len(tokens))
    if top_logprobs:
        for entry in entries:
            ranked = sorted((lp.rank, token, float(lp.logprob)) for token, lp in entry.items()
                            if lp.rank is not None and lp.rank <= top_logprobs and lp.logprob != float("-inf"))
            chunk.top_logprobs.append(([t for _, t, _ in ranked[:top_logprobs]],
                                       [v for _, _, v in ranked[:top_logprobs]]))
    return chunk


def prompt_scores(prompt_logprobs: Any, ids: list[int], score_from: int) -> list[float]:
    """The log-probability of each of ``ids`` from ``score_from`` on, from vLLM's prompt log-probs (one entry per
    prompt position, None at the first, each holding at least the prompt's own token)."""
    return [float(prompt_logprobs[i][ids[i]].logprob) for i in range(score_from, len(ids))]


def routing_of_rows(rows: Any, positions: int, sparse_layers: tuple[int, ...], num_experts: int) -> RoutedExperts:
    """vLLM's routed experts of a finished request (``CompletionOutput.routed_experts``: one row per position it
    fed, [rows, every decoder layer, top_k]) as the record's ``RoutedExperts`` over ``positions`` (the prompt and
    every sampled token but the last): the sparse layers only, -1 where vLLM sent no row."""
    import numpy as np

    given = np.asarray(rows)
    if given.ndim != 3:
        raise ValueError(f"vLLM's routed experts have shape {given.shape}, not [positions, layers, top_k]")
    if given.shape[1] <= max(sparse_layers, default=-1):
        raise ValueError(f"vLLM's routed experts cover {given.shape[1]} layers; the model's sparse layers go to "
                         f"{max(sparse_layers)}")
    ids = np.full((positions, len(sparse_layers), given.shape[2]), -1, dtype=np.int32)
    kept = min(positions, given.shape[0])
    ids[:kept] = given[:kept][:, list(sparse_layers)]
    return RoutedExperts(ids, num_experts)


def split_first(chunk: TokenChunk) -> tuple[TokenChunk, TokenChunk]:
    """``chunk``'s first token as a chunk of its own, and the rest."""
    tops = chunk.top_logprobs
    return (TokenChunk(chunk.token_ids[:1], chunk.logprobs[:1], chunk.weight_versions[:1], tops[:1]),
            TokenChunk(chunk.token_ids[1:], chunk.logprobs[1:], chunk.weight_versions[1:], tops[1:]))


def joined(held: TokenChunk, chunk: TokenChunk) -> TokenChunk:
    if not held.token_ids:
        return chunk
    return TokenChunk(held.token_ids + chunk.token_ids, held.logprobs + chunk.logprobs,
                      held.weight_versions + chunk.weight_versions, held.top_logprobs + chunk.top_logprobs)


def chunk_timing(chunk: TokenChunk, metrics: Any, started: float, first: float) -> None:
    now = time.perf_counter()
    chunk.total_s = now - started
    chunk.prefill_s, chunk.decode_s = first - started, now - first
    queued, scheduled = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "scheduled_ts", 0.0)
    if queued and scheduled >= queued:
        chunk.queue_s = scheduled - queued
        chunk.prefill_s = max(0.0, chunk.prefill_s - chunk.queue_s)


@dataclass
class Figures:
    """What vLLM's stat logger and the backend count, read by ``stats()``."""

    running: int = 0
    waiting: int = 0
    kv_used_frac: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    tokens: int = 0
    preemptions: int = 0
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=4096))

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs
            self.kv_used_frac = float(scheduler_stats.kv_cache_usage)
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self.prefix_queries += prefix.queries
                self.prefix_hits += prefix.hits
        if iteration_stats is not None:
            self.tokens += iteration_stats.num_generation_tokens
            self.preemptions += iteration_stats.num_preempted_reqs
            self.recent.append((time.perf_counter(), self.tokens))

    def tokens_per_s(self) -> float:
        now = time.perf_counter()
        while self.recent and now - self.recent[0][0] > 10.0:
            self.recent.popleft()
        if len(self.recent) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.recent[0], self.recent[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def stat_logger_class(figures: Figures) -> type:
    """A vLLM stat logger (its interface) that feeds ``figures``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class ForgeStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            figures.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return ForgeStatLogger
