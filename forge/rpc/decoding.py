"""Undecodable requests answered INVALID_ARGUMENT: server interceptors (threaded and asyncio servers) that take over
decoding each request, so that bytes which are not a valid message of the method (corrupt wire format, invalid
UTF-8 in a string field) are refused as bad input with the parser's reason, where grpc itself would answer INTERNAL
or UNKNOWN and log a traceback. Every Forge server installs one (``forge.rpc.server``)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc

Deserializer = Callable[[bytes], Any]


def _reason(method: str, exc: Exception) -> str:
    return f"the request to {method} could not be decoded: {type(exc).__name__}: {exc}"


def _factory(handler: grpc.RpcMethodHandler) -> tuple[Callable, Callable]:
    """The handler's behaviour and the function that builds a handler of its kind."""
    return {
        (False, False): (handler.unary_unary, grpc.unary_unary_rpc_method_handler),
        (False, True): (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
        (True, False): (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
        (True, True): (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
    }[(handler.request_streaming, handler.response_streaming)]


def _rebuilt(handler: grpc.RpcMethodHandler, behaviour: Callable) -> grpc.RpcMethodHandler:
    _, factory = _factory(handler)
    return factory(behaviour, request_deserializer=None, response_serializer=handler.response_serializer)


def _sync_guard(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    behaviour, _ = _factory(handler)
    decode: Deserializer = handler.request_deserializer

    def parse(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            return decode(raw)
        except Exception as exc:    # any parser failure is the request's fault
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _reason(method, exc))

    if handler.request_streaming:
        def run_stream(raw_requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            return behaviour((parse(raw, context) for raw in raw_requests), context)

        return _rebuilt(handler, run_stream)

    def run(raw: bytes, context: grpc.ServicerContext) -> Any:
        return behaviour(parse(raw, context), context)

    return _rebuilt(handler, run)


def _aio_guard(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """As ``_sync_guard`` for ``grpc.aio``, keeping the behaviour's kind (coroutine, async generator or plain
    function run in a thread), which the aio server looks at to decide how to call it."""
    behaviour, _ = _factory(handler)
    if not (inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)):
        return _sync_guard(handler, method)
    decode: Deserializer = handler.request_deserializer

    async def parse(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return decode(raw)
        except Exception as exc:    # any parser failure is the request's fault
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _reason(method, exc))

    async def parsed_stream(raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[Any]:
        async for raw in raw_requests:
            yield await parse(raw, context)

    async def request_of(raw: Any, context: grpc.aio.ServicerContext) -> Any:
        return parsed_stream(raw, context) if handler.request_streaming else await parse(raw, context)

    if inspect.isasyncgenfunction(behaviour):
        async def run_gen(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behaviour(await request_of(raw, context), context):
                yield item

        return _rebuilt(handler, run_gen)

    async def run(raw: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(await request_of(raw, context), context)

    return _rebuilt(handler, run)


class DecodeInterceptor(grpc.ServerInterceptor):
    """Refuses (INVALID_ARGUMENT) a request that does not decode as its method's message."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return _sync_guard(handler, handler_call_details.method)


class AioDecodeInterceptor(grpc.aio.ServerInterceptor):
    """``DecodeInterceptor`` for ``grpc.aio`` servers."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return _aio_guard(handler, handler_call_details.method)
