"""The gRPC front end (forge.v1.Gateway) for white-box agents: sessions, streaming Chat, token-level Generate (each
also answered as one message: ChatWhole, GenerateWhole), process rewards and Stats, each translated to a call of the
gateway and its result back. Handlers are coroutines on
the gateway's event loop (a ``grpc.aio`` server on that loop), beside the HTTP front end and the actor streams: an
open call holds no thread.

API keys follow ``auth.py``: with keys configured, the interceptor refuses a call whose key the policy does not
admit for its method, before the call is read; the handlers ask it about the session a call names."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from forge.gateway.auth import KeyPolicy, Operation
from forge.gateway.calls import ChatResult
from forge.gateway.errors import GatewayError
from forge.gateway.messages import chat_call_from_proto
from forge.gateway.service import CallStream, Gateway
from forge.rpc.auth import AioApiKeyInterceptor, key_from_metadata
from forge.rpc.server import HEALTH_SERVICE
from forge.v1 import actor_pb2, gateway_pb2, gateway_pb2_grpc, pool_pb2

log = logging.getLogger(__name__)

SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
OPERATIONS = {f"/{SERVICE}/{name}": operation for name, operation in (
    ("StartSession", Operation.START_SESSION), ("EndSession", Operation.END_SESSION),
    ("AddReward", Operation.ADD_REWARD), ("Chat", Operation.CHAT), ("ChatWhole", Operation.CHAT),
    ("Generate", Operation.GENERATE), ("GenerateWhole", Operation.GENERATE), ("Stats", Operation.STATS))}
CALL_INDEX_KEY = "forge-call-index"
T = TypeVar("T")


def key_interceptor(policy: KeyPolicy) -> AioApiKeyInterceptor:
    """Admits a call by the policy's decision for its method (reflection: any method not of the Gateway)."""

    def admitted(key: str, method: str) -> bool:
        try:
            policy.check(key, OPERATIONS.get(method, Operation.REFLECTION))
        except GatewayError:
            return False
        return True

    return AioApiKeyInterceptor((), exempt=(HEALTH_SERVICE,), extra_check=admitted)


async def _abort(context: grpc.aio.ServicerContext, gateway: Gateway, error: Exception, method: str) -> None:
    if isinstance(error, GatewayError):
        gateway.metrics.count("client_errors" if error.status < 500 else "errors")
        await context.abort(error.grpc_code, error.message)
    gateway.metrics.count("errors")
    log.error("Gateway.%s failed", method, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {type(error).__name__}: {error}")


def _unary(method: Callable) -> Callable:
    @functools.wraps(method)
    async def run(self: GatewayServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.gateway.metrics.count("grpc_requests")
        try:
            return await method(self, request, context)
        except Exception as exc:
            await _abort(context, self.gateway, exc, method.__name__)

    return run


def _streaming(method: Callable) -> Callable:
    @functools.wraps(method)
    async def run(self: GatewayServicer, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self.gateway.metrics.count("grpc_requests")
        try:
            async for item in method(self, request, context):
                yield item
        except Exception as exc:
            await _abort(context, self.gateway, exc, method.__name__)

    return run


def chat_chunk(event: Any, whole: bool = False) -> gateway_pb2.ChatChunk:
    """The chunk of a delta or of the result; ``whole``: the result of a call answered in one chunk, with the whole
    completion's ids, log-probs and versions (its text is whole already)."""
    if whole:
        chunk = gateway_pb2.ChatChunk(text=event.text, token_ids=event.completion_ids, logprobs=event.all_logprobs,
                                      weight_versions=event.all_weight_versions, top_logprobs=event.all_top_logprobs)
    else:
        chunk = gateway_pb2.ChatChunk(text=event.text, token_ids=event.token_ids, logprobs=event.logprobs,
                                      weight_versions=event.weight_versions, top_logprobs=event.top_logprobs)
    if isinstance(event, ChatResult):
        parsed = event.parsed
        chunk.finish_reason = event.finish_reason
        chunk.call_index = event.call_index
        chunk.prompt_tokens = len(event.prompt_ids)
        chunk.completion_tokens = len(event.completion_ids)
        chunk.content = parsed.content
        chunk.reasoning_content = parsed.reasoning or ""
        chunk.tool_calls.extend(gateway_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                                for c in parsed.tool_calls)
    return chunk


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def _session_id(self, context: grpc.aio.ServicerContext, operation: Operation, requested: str) -> str:
        """The session a call acts on: the requested one, or its per-session key's ("" when neither)."""
        key = key_from_metadata(context.invocation_metadata())
        return self.gateway.policy.check(key, operation, requested) or ""

    @_unary
    async def StartSession(self, request, context):
        open_request = pool_pb2.OpenSessionRequest(task_id=request.task_id, domain=request.domain,
                                                   group_id=request.group_id, group_size=request.group_size,
                                                   metadata=request.metadata)
        record, key, url = await self.gateway.start_session(open_request, request.issue_api_key)
        return gateway_pb2.StartSessionResponse(session=record, api_key=key or "", base_url=url)

    @_unary
    async def EndSession(self, request, context):
        session_id = self._session_id(context, Operation.END_SESSION, request.session_id)
        close = pool_pb2.CloseSessionRequest(session_id=session_id, failed=request.failed,
                                             failure_reason=request.failure_reason,
                                             outcome_rewards=request.outcome_rewards, metrics=request.metrics)
        return await self.gateway.end_session(close)

    @_unary
    async def AddReward(self, request, context):
        session_id = self._session_id(context, Operation.ADD_REWARD, request.session_id)
        await self.gateway.add_reward(session_id, request.call_index, request.reward)
        return gateway_pb2.AddRewardResponse()

    @_unary
    async def Stats(self, request, context):
        return self.gateway.report()

    async def _chat(self, request: gateway_pb2.ChatRequest, context: grpc.aio.ServicerContext, whole: bool
                    ) -> CallStream:
        session_id = self._session_id(context, Operation.CHAT, request.session_id)
        model = self.gateway.model
        size = request.ByteSize()
        call = await self.gateway.work.run(size, chat_call_from_proto, request, model.vocab_size, model.context_length)
        return await self.gateway.chat(call, session_id, stream=not whole, size=size)

    async def _generate(self, request: gateway_pb2.SessionGenerateRequest, context: grpc.aio.ServicerContext,
                        whole: bool) -> AsyncGenerator[actor_pb2.GenerateChunk, None]:
        session_id = self._session_id(context, Operation.GENERATE, request.session_id)
        stream = await self.gateway.generate(session_id, request.prompt_ids, request.sampling, whole=whole)
        async with contextlib.aclosing(stream.events) as events:
            async for chunk, index in events:
                if index is not None:
                    context.set_trailing_metadata(((CALL_INDEX_KEY, str(index)),))
                yield chunk

    @_streaming
    async def Chat(self, request, context):
        stream = await self._chat(request, context, request.whole)
        async for event in stream.events:
            yield chat_chunk(event, request.whole)

    @_unary
    async def ChatWhole(self, request, context):
        stream = await self._chat(request, context, whole=True)
        return chat_chunk(await _last(stream.events), whole=True)

    @_streaming
    async def Generate(self, request, context):
        async for chunk in self._generate(request, context, request.whole):
            yield chunk

    @_unary
    async def GenerateWhole(self, request, context):
        return await _last(self._generate(request, context, whole=True))


async def _last(items: AsyncGenerator[T, None]) -> T:
    """The last of a call's events: a call answered whole has only its result. Closed at once when the caller goes
    away (its task cancelled), which stops the call's generation."""
    last = None
    async with contextlib.aclosing(items) as events:
        async for item in events:
            last = item
    if last is None:
        raise RuntimeError("the call ended without a result")
    return last
