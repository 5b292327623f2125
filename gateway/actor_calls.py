"""One generation on the actors (``ActorCall``): a stream that moves to another actor when one fails before its first
token (after it, the call fails).

With prefill actors (disaggregated serving), a call is first prefilled on one of them (its first token sampled,
its prompt's KV blocks stored in the L3 cache), then continued on a decode actor chosen by the router. The first
token is held until the decode actor streams, so that a handover the decode actor refuses (another weight version)
can be prefilled again without the agent having seen a token that would then change. A prefill actor that fails is
replaced by another; with none left, or after repeated refusals, the decode actor serves the whole call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from forge import expert_routing
from forge.gateway.actors import ActorSet, ActorState, cancelled_here
from forge.gateway.errors import BadRequest, Unavailable, UpstreamFailed
from forge.gateway.routing import NoActorAvailable, RouteRequest
from forge.stream_interval import WHOLE_ANSWER
from forge.v1 import actor_pb2, common_pb2

log = logging.getLogger(__name__)

ERROR, ABORT = common_pb2.FINISH_REASON_ERROR, common_pb2.FINISH_REASON_ABORT


class _Retry(Exception):
    pass


class _StaleHandover(Exception):
    """The decode actor refused a continuation sampled under another weight version: prefill it again."""


HANDOVER_TRIES = 3


def joined(first: actor_pb2.GenerateChunk, chunk: actor_pb2.GenerateChunk) -> actor_pb2.GenerateChunk:
    """The prefill's chunk (its one token) followed by the decode actor's first chunk, as one chunk of the decode
    actor's: the call's first chunk, as a single actor would have streamed it."""
    merged = actor_pb2.GenerateChunk(token_ids=first.token_ids, logprobs=first.logprobs,
                                     weight_versions=first.weight_versions, top_logprobs=first.top_logprobs)
    merged.MergeFrom(chunk)             # appends the repeated fields, takes the decode actor's others
    merged.cached_prompt_tokens = first.cached_prompt_tokens
    return merged


def first_token_s(chunk: actor_pb2.GenerateChunk, elapsed_s: float) -> float:
    """When the first token of ``chunk`` (received ``elapsed_s`` after the call was sent) came: then, unless the chunk
    also ends the call (a whole answer), whose tokens after the first took the actor ``timing.decode_s``."""
    return max(0.0, elapsed_s - chunk.timing.decode_s) if chunk.finish_reason else elapsed_s


def with_prefill_routing(last: actor_pb2.GenerateChunk, prefill: actor_pb2.GenerateChunk) -> None:
    """Complete the decode actor's routing record with the prefill actor's: the decode actor fetched the prompt's
    KV, so it did not route those positions; the prefill actor did."""
    if not (last.HasField("routed_experts") and prefill.HasField("routed_experts")):
        return
    try:
        ids, given = expert_routing.decode(last.routed_experts), expert_routing.decode(prefill.routed_experts)
    except ValueError as exc:
        log.warning("a routing record is malformed (%s); kept as the decode actor sent it", exc)
        return
    if ids is not None and given is not None and ids.shape[1:] == given.shape[1:]:
        last.routed_experts.CopyFrom(expert_routing.encode(expert_routing.filled(ids, given),
                                                           last.routed_experts.num_experts))


class ActorCall:
    """One generation: iterate ``chunks()``; ``abort()`` stops it (the stream then ends with ABORT). Fails over to
    another actor while no token has arrived; after the first token an actor failure raises UpstreamFailed.
    ``whole``: the caller needs only the answer, which comes as one chunk (the actor's GenerateWhole; from an actor
    that lacks it, a stream of the first token and then the rest), and an actor that fails before answering is
    replaced, as nothing has been shown; else the tokens stream at the actor's interval."""

    def __init__(self, actors: ActorSet, route: RouteRequest, sampling: common_pb2.SamplingParams,
                 whole: bool = False) -> None:
        self.actors = actors
        self.route = route
        self.sampling = sampling
        self.whole = whole
        self.stream_interval = WHOLE_ANSWER if whole else 0
        self.actor: ActorState | None = None
        self.request_id = ""
        self.aborted = False
        self.attempts = 0

    async def chunks(self) -> AsyncIterator[actor_pb2.GenerateChunk]:
        pool = self.actors.prefill
        prompt_tokens = len(self.route.prompt_ids)
        for attempt in range(HANDOVER_TRIES):
            # without a prefill pool, the router's cache estimate is not computed at all
            if not (pool.actors and pool.wanted(prompt_tokens, self.actors.router.cached_tokens(self.route))):
                break
            first = await self._prefill()
            if first is None:                   # no prefill actor could: the decode actor prefills
                pool.counters["handover_fallbacks"] += 1
                break
            if not first.continues or self.aborted:
                yield first                     # the call ended at its first token (or was aborted)
                return
            continuation = actor_pb2.Continuation(token_ids=first.token_ids, logprobs=first.logprobs,
                                                  weight_version=first.weight_versions[0])
            try:
                async for chunk in self._decode(continuation, first):
                    yield chunk
                return
            except _StaleHandover as exc:
                pool.counters["handover_redone"] += 1
                log.info("handover refused (%s); prefilling again (%d)", exc, attempt + 1)
        else:
            pool.counters["handover_fallbacks"] += 1
        async for chunk in self._decode(None, None):
            yield chunk

    async def _prefill(self) -> actor_pb2.GenerateChunk | None:
        """The call's first token from a prefill actor, its prompt's blocks stored in L3; None when no prefill
        actor could give it."""
        pool, route = self.actors.prefill, self.route
        tried: set[str] = set()
        tokens = len(route.prompt_ids)
        while True:
            try:
                actor = pool.choose(route.session_id, tokens, tried)
            except NoActorAvailable:
                return None
            address = actor.endpoint.address
            tried.add(address)
            if len(tried) > 1:
                pool.counters["prefill_retries"] += 1
            self.actor, self.request_id = actor, uuid.uuid4().hex
            request = actor_pb2.GenerateRequest(request_id=self.request_id, prompt_ids=route.prompt_ids,
                                                sampling=self.sampling, session_id=route.session_id,
                                                prefill_only=True)
            pool.started(route.session_id, address, tokens)
            actor.in_flight += 1
            actor.calls += 1
            try:
                chunks = [c async for c in actor.stub.Generate(request, metadata=self.actors.metadata)]
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise BadRequest(f"the actor refused the request: {exc.details()}") from exc
                actor.failures += 1
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    actor.healthy = False
                log.warning("prefill actor %s failed (%s); trying another", address, exc.code().name)
                continue
            except asyncio.CancelledError:
                if cancelled_here():
                    raise
                actor.failures += 1
                log.warning("prefill actor %s was dropped during a prefill; trying another", address)
                continue
            finally:
                actor.in_flight -= 1
                pool.finished(address, tokens)
            last = chunks[-1] if chunks else None
            if last is not None and (last.finish_reason not in (ERROR, ABORT) or self.aborted):
                return last                     # a prefill answers in one chunk
            actor.failures += 1
            log.warning("prefill actor %s failed: %s; trying another", address,
                        last.error if last is not None else "the stream ended without a chunk")

    async def _decode(self, continuation: actor_pb2.Continuation | None, held: actor_pb2.GenerateChunk | None
                      ) -> AsyncIterator[actor_pb2.GenerateChunk]:
        """The call on a decode actor (or a ``both`` one): whole, or after ``continuation``, with ``held`` (the
        prefill's chunk) joined to the front of its first chunk."""
        tried: set[str] = set()
        last_error = ""
        while True:
            try:
                endpoint = self.actors.router.choose(self.route, tried)
            except NoActorAvailable as exc:
                why = last_error or (exc if self.actors.actors else self.actors.no_actors())
                raise Unavailable(f"no actor could take the call: {why}", code="no_actor") from exc
            tried.add(endpoint.address)
            actor = self.actors.by_address.get(endpoint.address)
            if actor is None or actor.stub is None:     # a router answering an actor that left: ask again
                log.warning("the router chose %s, which is not an actor in use; asking again", endpoint.address)
                continue
            self.actor, self.request_id = actor, uuid.uuid4().hex
            self.attempts += 1
            if self.attempts > 1:
                self.actors.retries += 1
            actor.in_flight += 1
            actor.calls += 1
            request = actor_pb2.GenerateRequest(request_id=self.request_id, prompt_ids=self.route.prompt_ids,
                                                sampling=self.sampling, session_id=self.route.session_id,
                                                stream_interval=self.stream_interval, continuation=continuation,
                                                adapter=self.actors.adapter)
            started = False
            sent = time.monotonic()
            router = self.actors.router
            try:
                async with contextlib.aclosing(self._attempt(actor, request)) as chunks:
                    async for chunk in chunks:
                        if not started and chunk.token_ids:
                            router.on_first_token(self.route, endpoint.address,
                                                  first_token_s(chunk, time.monotonic() - sent))
                        if chunk.finish_reason in (ERROR, ABORT) and not self.aborted:
                            what = chunk.error or ("the actor aborted the call" if chunk.finish_reason == ABORT
                                                   else "the actor failed")
                            if started or chunk.token_ids:
                                raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: {what}")
                            if continuation is not None and chunk.retryable:
                                raise _StaleHandover(what)
                            raise _Retry(what)
                        if held is not None and not started:
                            chunk = joined(held, chunk)
                        if held is not None and chunk.finish_reason:
                            with_prefill_routing(chunk, held)
                        started = started or bool(chunk.token_ids)
                        yield chunk
                        if chunk.finish_reason:
                            return
                raise _Retry("the actor closed the stream without finishing")
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or exc.code().name
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise BadRequest(f"the actor refused the request: {details}") from exc
                actor.failures += 1
                if code == grpc.StatusCode.UNAVAILABLE:
                    actor.healthy = False
                if started:
                    raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: {code.name}: "
                                         f"{details}") from exc
                last_error = f"{endpoint.address}: {code.name}: {details}"
                log.warning("actor %s failed before the first token (%s: %s); trying another", endpoint.address,
                            code.name, details)
            except _Retry as exc:
                actor.failures += 1
                if started:
                    raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: {exc}") from exc
                last_error = f"{endpoint.address}: {exc}"
                log.warning("actor %s failed before the first token (%s); trying another", endpoint.address, exc)
            except UpstreamFailed:
                actor.failures += 1
                raise
            except asyncio.CancelledError:
                if cancelled_here():
                    raise
                actor.failures += 1                 # its channel was closed under the call: it was dropped
                if started:
                    raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: it was dropped") from None
                last_error = f"{endpoint.address}: dropped"
                log.warning("actor %s was dropped before the first token; trying another", endpoint.address)
            finally:
                actor.in_flight -= 1
                router.on_done(self.route, endpoint.address)

    async def _attempt(self, actor: ActorState, request: actor_pb2.GenerateRequest
                       ) -> AsyncIterator[actor_pb2.GenerateChunk]:
        """``request``'s chunks from ``actor``: one, the whole answer, when the call is ``whole`` and the actor serves
        GenerateWhole (one of an older Forge answers UNIMPLEMENTED and is read as a stream from then on)."""
        metadata = self.actors.metadata
        if self.whole and actor.answers_whole:
            answer = actor.stub.GenerateWhole(request, metadata=metadata)
            try:
                yield await answer
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                actor.answers_whole = False
                log.info("actor %s has no GenerateWhole; its answers are read as streams", actor.endpoint.address)
            finally:
                if not answer.done():
                    answer.cancel()
        stream = actor.stub.Generate(request, metadata=metadata)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            if not stream.done():
                stream.cancel()

    async def abort(self) -> None:
        """Ask the actor to stop; the remaining chunks (ending with ABORT) still arrive."""
        if self.aborted or self.actor is None or self.actor.channel is None:
            return
        self.aborted = True
        try:
            await self.actor.stub.Abort(actor_pb2.AbortRequest(request_id=self.request_id),
                                        metadata=self.actors.metadata, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            log.warning("abort of %s on %s failed: %s", self.request_id, self.actor.endpoint.address, exc.code().name)
