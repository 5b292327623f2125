"""The gRPC Actor service over any backend: server-streaming Generate (and GenerateWhole, its chunks joined into one
answer), Abort and Stats, for a ``grpc.aio`` server.

Generate is a coroutine: every open stream waits on the server's one event loop, so their number is bounded by the
backend's queue, not by a thread pool, and a step's chunks for many streams cost one wake-up. Abort and Stats are
plain functions (a backend may block on them), run in the server's thread pool. Requests are validated before they
are queued; bad ones get INVALID_ARGUMENT with the reason, a full queue gets RESOURCE_EXHAUSTED. A client that goes
away (cancel, deadline, dropped connection) aborts its request, which frees its KV blocks.

A request's grammar is checked as the gateway checks it (the same bounds, then compiled in the grammar sandbox,
``forge.structured``) before any backend compiles it in this process: a grammar whose compilation would exhaust
memory ends the sandbox's process, never the actor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from forge.actors.backend import (
    Backend,
    Continuation,
    FinishReason,
    GenerationRequest,
    InvalidRequest,
    Overloaded,
    TokenChunk,
)
from forge.expert_routing import encode as encode_routing
from forge.sampling.params import SamplingError
from forge.sampling.wire import sampling_from_proto
from forge.stream_interval import WHOLE_ANSWER
from forge.structured.check import wire_grammar_problem
from forge.structured.sandbox import GrammarSandbox, SandboxUnavailable
from forge.telemetry import stats_report
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

FINISH_TO_PROTO = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def chunk_to_proto(request_id: str, chunk: TokenChunk, actor: str, first: bool) -> actor_pb2.GenerateChunk:
    message = actor_pb2.GenerateChunk(request_id=request_id, token_ids=chunk.token_ids, logprobs=chunk.logprobs,
                                      weight_versions=chunk.weight_versions,
                                      top_logprobs=[common_pb2.TopLogprobs(token_ids=ids, logprobs=values)
                                                    for ids, values in chunk.top_logprobs])
    if first:
        message.actor = actor
        message.cached_prompt_tokens = chunk.cached_prompt_tokens
    if chunk.finish_reason is not None:
        message.finish_reason = FINISH_TO_PROTO[chunk.finish_reason]
        message.error = chunk.error
        message.handover_blocks = chunk.handover_blocks
        message.retryable = chunk.retryable
        message.continues = chunk.continues
        if chunk.routed_experts is not None:
            message.routed_experts.CopyFrom(encode_routing(chunk.routed_experts.ids, chunk.routed_experts.num_experts))
        message.timing.CopyFrom(common_pb2.Timing(queue_s=chunk.queue_s, prefill_s=chunk.prefill_s,
                                                  decode_s=chunk.decode_s, total_s=chunk.total_s))
    return message


def request_from_proto(request: actor_pb2.GenerateRequest) -> GenerationRequest:
    continuation = None
    if request.HasField("continuation"):
        given = request.continuation
        continuation = Continuation(list(given.token_ids), list(given.logprobs), given.weight_version)
    return GenerationRequest(request.request_id, list(request.prompt_ids), sampling_from_proto(request.sampling),
                             request.session_id, request.stream_interval, request.prefill_only, continuation,
                             request.adapter, request.score_from)


class ActorServicer(actor_pb2_grpc.ActorServicer):
    def __init__(self, backend: Backend, instance: str, labels: dict[str, str] | None = None,
                 role: str = "both", figures: Callable[[], dict[str, float]] | None = None,
                 grammars: GrammarSandbox | None = None) -> None:
        """``figures``: more gauges for Stats beside the backend's (e.g. a weight relay's ``relay_*``);
        ``grammars``: the sandbox requests' grammars are compiled in first (None: the model has no tokenizer.json,
        and the backend refuses structured output)."""
        self.backend = backend
        self.figures = figures
        self.grammars = grammars
        self.instance = instance
        self.role = role
        self.labels = {"backend": backend.name, "role": role, **(labels or {})}
        self.started = time.time()

    def _role_refusal(self, request: actor_pb2.GenerateRequest) -> str | None:
        """Why this actor does not serve ``request`` (None: it does)."""
        handover = request.prefill_only or request.HasField("continuation")
        if request.score_from and not self.backend.scores:
            return f"the {self.backend.name} backend does not score prompts (score_from): the torch engine does"
        if handover and not self.backend.hands_over:
            return f"the {self.backend.name} backend serves no prefill-only requests or continuations"
        if self.role == "prefill" and not request.prefill_only:
            return "this is a prefill actor (--role prefill): it serves prefill-only requests only"
        if self.role == "decode" and request.prefill_only:
            return "this is a decode actor (--role decode): send prefill-only requests to a prefill actor"
        return None

    async def _grammar_problem(self, sampling: common_pb2.SamplingParams) -> str | None:
        """Why the request's grammar (if any) may not be compiled here, or None."""
        if not sampling.HasField("grammar"):
            return None
        try:
            return await wire_grammar_problem(sampling.grammar, self.grammars)
        except SandboxUnavailable as exc:
            log.error("structured output cannot be checked: %s", exc)
            return f"structured output is unavailable on this actor: {exc}"

    async def Generate(self, request: actor_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        refusal = self._role_refusal(request)
        if refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        problem = await self._grammar_problem(request.sampling)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"grammar: {problem}")
        try:
            stream = self.backend.submit(request_from_proto(request))
        except (InvalidRequest, SamplingError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        request_id = stream.request_id

        def on_done(_context: object) -> None:
            if not stream.finished.is_set():
                self.backend.abort(request_id)

        context.add_done_callback(on_done)
        first = True
        async for chunk in stream:
            yield chunk_to_proto(request_id, chunk, self.instance, first)
            first = False

    async def GenerateWhole(self, request: actor_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                            ) -> actor_pb2.GenerateChunk:
        """Generate's chunks joined into one answer (the same checks and refusals; a caller that goes away aborts
        the request as it does a stream's). Its tokens after the first come in one message of the backend's, whatever
        stream interval the request asks."""
        request.stream_interval = WHOLE_ANSWER
        whole = actor_pb2.GenerateChunk()
        async for chunk in self.Generate(request, context):
            whole.MergeFrom(chunk)      # repeated fields append; the last chunk's set fields win, the first's stay
        return whole

    def Abort(self, request: actor_pb2.AbortRequest, context: grpc.ServicerContext) -> actor_pb2.AbortResponse:
        if not request.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        return actor_pb2.AbortResponse(found=self.backend.abort(request.request_id))

    def Stats(self, request: common_pb2.StatsRequest, context: grpc.ServicerContext) -> common_pb2.StatsReport:
        return self.report()

    def report(self) -> common_pb2.StatsReport:
        """What Stats answers (and a Prometheus scrape reads)."""
        figures = self.backend.stats()
        if self.figures is not None:
            figures = {**figures, **self.figures()}
        if self.grammars is not None:
            figures = {**figures, **self.grammars.gauges()}
        return stats_report("actor", self.instance, self.started, figures, self.labels)
