"""Scoring on vLLM: a request with ``score_from`` runs one discarded token with ``prompt_logprobs=0`` at temperature 1,
and answers the log-probability vLLM gives each of its tokens from ``score_from`` on (its prompt log-probs, from the
raw logits) in one chunk that ends it."""

from __future__ import annotations

import time
from typing import Any

from forge.actors.backend import FinishReason, GenerationRequest, RequestStream, TokenChunk
from forge.actors.vllm import outputs


def score_params() -> Any:
    """vLLM's sampling parameters of a scoring request: one token, discarded; the prompt's own log-probs."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, max_tokens=1, temperature=1.0,
                              prompt_logprobs=0, detokenize=False)


async def score(llm: Any, request: GenerationRequest, params: Any, stream: RequestStream, lora: Any,
                version: int) -> None:
    """Score ``request`` on the engine ``llm`` (with the adapter ``lora``, at weight ``version``) into ``stream``."""
    from vllm.inputs import TokensPrompt

    ids = list(request.prompt_ids)
    started = time.perf_counter()
    final = None
    async for output in llm.generate(TokensPrompt(prompt_token_ids=ids), params, request.request_id,
                                     lora_request=lora):
        final = output
    if final is None or final.prompt_logprobs is None:
        raise RuntimeError("vLLM returned no prompt log-probs")
    scored = ids[request.score_from:]
    chunk = TokenChunk(scored, outputs.prompt_scores(final.prompt_logprobs, ids, request.score_from),
                       [version] * len(scored), cached_prompt_tokens=int(final.num_cached_tokens or 0),
                       finish_reason=FinishReason.STOP)
    outputs.chunk_timing(chunk, final.metrics, started, time.perf_counter())
    stream.put(chunk)
