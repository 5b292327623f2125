"""One sampled sequence from a Forge actor, for the Tinker server: its gRPC ``Generate`` called with a Tinker
request's sampling parameters, the stream read into tokens, per-token log-probabilities and a stop reason.

The actor stops on token ids (the request's ``stop`` tokens and, unless ``stop=[]``, the model's end of sequence).
Stop strings it does not know: the completion is decoded as it streams in, and at the first stop string the
sequence is cut after the token that completed it (the tokens the SDK's renderers then find it in, as a Tinker
sampler returns them), the call is cancelled (the actor aborts it) and the stop reason is ``"stop"``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from forge.learner.tinker.types import SampledSequence, SampleParams, UserError
from forge.sampling.params import SamplingError, SamplingParams
from forge.sampling.wire import sampling_to_proto
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

SEEDS = 2**63                       # an actor's seeds are in [0, 2**63)
STOP_REASONS = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length"}


class AdapterMissing(RuntimeError):
    """The actor does not serve the adapter the request named (dropped since, or the actor restarted)."""


def sampling_message(params: SampleParams, index: int) -> common_pb2.SamplingParams:
    """The actor's sampling parameters for sample ``index`` of a request (a given seed made distinct per sample);
    UserError for values the actor refuses."""
    try:
        return sampling_to_proto(SamplingParams(
            temperature=params.temperature, top_p=params.top_p, top_k=max(params.top_k, 0),
            seed=None if params.seed is None else (params.seed + index) % SEEDS, max_tokens=params.max_tokens,
            stop_token_ids=tuple(params.stop_tokens), ignore_eos=not params.stop_at_eos))
    except SamplingError as exc:
        raise UserError(f"sampling parameters: {exc}") from None


def stop_cut(tokens: Sequence[int], decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> int | None:
    """The fewest leading tokens of ``tokens`` whose text holds one of ``stops`` (None: none does)."""
    if not any(stop in decode(tokens) for stop in stops):
        return None
    low, high = 1, len(tokens)
    while low < high:
        middle = (low + high) // 2
        if any(stop in decode(tokens[:middle]) for stop in stops):
            high = middle
        else:
            low = middle + 1
    return low


async def generate(stub: actor_pb2_grpc.ActorStub, request: actor_pb2.GenerateRequest, metadata,
                   stops: Sequence[str] = (), decode: Callable[[Sequence[int]], str] | None = None
                   ) -> SampledSequence:
    """Sample one sequence; UserError for a request the actor refuses, AdapterMissing, or RuntimeError."""
    tokens: list[int] = []
    logprobs: list[float] = []
    call = stub.Generate(request, metadata=metadata)
    try:
        async for chunk in call:
            tokens.extend(chunk.token_ids)
            logprobs.extend(chunk.logprobs)
            if stops and chunk.token_ids:
                cut = stop_cut(tokens, decode, stops)
                if cut is not None:
                    call.cancel()
                    return SampledSequence(tokens[:cut], logprobs[:cut], "stop")
            if chunk.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                return _finished(chunk, tokens, logprobs)
    except grpc.aio.AioRpcError as exc:
        raise _refusal(exc, request.adapter) from None
    raise RuntimeError("the actor's stream ended without a finish reason")


def _finished(chunk: actor_pb2.GenerateChunk, tokens: list[int], logprobs: list[float]) -> SampledSequence:
    reason = STOP_REASONS.get(chunk.finish_reason)
    if reason is None:
        if "no longer served" in chunk.error or "no adapter named" in chunk.error:
            raise AdapterMissing(chunk.error)
        raise RuntimeError(f"the actor did not finish the sequence: {chunk.error or 'aborted'}")
    return SampledSequence(tokens, logprobs, reason)


def _refusal(exc: grpc.aio.AioRpcError, adapter: str) -> Exception:
    details = exc.details() or str(exc.code())
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        if adapter and f"no adapter named {adapter!r}" in details:
            return AdapterMissing(details)
        return UserError(details)
    return RuntimeError(f"the actor refused the sample ({exc.code().name}): {details}")


__all__ = ["AdapterMissing", "generate", "sampling_message", "stop_cut"]
