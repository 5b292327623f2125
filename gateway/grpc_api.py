"""The gRPC front end (forge.v1.Gateway) for white-box agents: sessions, streaming Chat, token-level Generate,
process rewards and Stats, each translated to a call of the gateway and its result back. Handlers are coroutines on
the gateway's event loop (a ``grpc.aio`` server on that loop), beside the HTTP front end and the actor streams: an
open call holds no thread.

With API keys configured, a per-session key is accepted for Chat, Generate, AddReward and EndSession of its own
session only; everything else needs a global key."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from forge.gateway.calls import ChatResult
from forge.gateway.errors import BadRequest, Forbidden, GatewayError
from forge.gateway.keys import KeyRing
from forge.gateway.messages import chat_call_from_proto
from forge.gateway.service import Gateway
from forge.rpc.auth import AioApiKeyInterceptor, key_from_metadata
from forge.rpc.server import HEALTH_SERVICE
from forge.v1 import gateway_pb2, gateway_pb2_grpc, pool_pb2

log = logging.getLogger(__name__)

SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
SESSION_METHODS = frozenset(f"/{SERVICE}/{m}" for m in ("Chat", "Generate", "AddReward", "EndSession"))
CALL_INDEX_KEY = "forge-call-index"


def key_interceptor(keys: KeyRing) -> AioApiKeyInterceptor:
    def session_key(key: str, method: str) -> bool:
        return method in SESSION_METHODS and keys.session_of(key) is not None

    return AioApiKeyInterceptor(keys.global_keys, exempt=(HEALTH_SERVICE,), extra_check=session_key)


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


def chat_chunk(event: Any) -> gateway_pb2.ChatChunk:
    chunk = gateway_pb2.ChatChunk(text=event.text, token_ids=event.token_ids, logprobs=event.logprobs,
                                  weight_versions=event.weight_versions)
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

    def _session_id(self, requested: str, context: grpc.aio.ServicerContext) -> str:
        """The session a call is for: the requested one, checked against a per-session key if that is what
        admitted the call; or the key's own session."""
        keys = self.gateway.keys
        key = key_from_metadata(context.invocation_metadata())
        owner = keys.session_of(key)
        if keys.required and not keys.is_global(key) and requested and requested != owner:
            raise Forbidden("this API key belongs to another session")
        session_id = requested or owner
        if not session_id:
            raise BadRequest("session_id is required (StartSession gives one)", "session_id")
        return session_id

    @_unary
    async def StartSession(self, request, context):
        open_request = pool_pb2.OpenSessionRequest(task_id=request.task_id, domain=request.domain,
                                                   group_id=request.group_id, group_size=request.group_size,
                                                   metadata=request.metadata)
        record, key, url = await self.gateway.start_session(open_request, request.issue_api_key)
        return gateway_pb2.StartSessionResponse(session=record, api_key=key or "", base_url=url)

    @_unary
    async def EndSession(self, request, context):
        close = pool_pb2.CloseSessionRequest(session_id=self._session_id(request.session_id, context),
                                             failed=request.failed, failure_reason=request.failure_reason,
                                             outcome_rewards=request.outcome_rewards, metrics=request.metrics)
        return await self.gateway.end_session(close)

    @_unary
    async def AddReward(self, request, context):
        session_id = self._session_id(request.session_id, context)
        await self.gateway.add_reward(session_id, request.call_index, request.reward)
        return gateway_pb2.AddRewardResponse()

    @_unary
    async def Stats(self, request, context):
        return self.gateway.report()

    @_streaming
    async def Chat(self, request, context):
        session_id = self._session_id(request.session_id, context)
        call = chat_call_from_proto(request, self.gateway.model.vocab_size)
        stream = await self.gateway.chat(call, session_id)
        async for event in stream.events:
            yield chat_chunk(event)

    @_streaming
    async def Generate(self, request, context):
        session_id = self._session_id(request.session_id, context)
        stream = await self.gateway.generate(session_id, request.prompt_ids, request.sampling)
        async for chunk, index in stream.events:
            if index is not None:
                context.set_trailing_metadata(((CALL_INDEX_KEY, str(index)),))
            yield chunk
