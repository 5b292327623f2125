"""API keys on gRPC: server interceptors (threaded and asyncio servers) that refuse calls without a valid key, and
the client side that sends one. Keys travel in the ``authorization: Bearer <key>`` metadata (``x-api-key`` is
accepted too); they are compared in constant time and never logged."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable

import grpc

KeyCheck = Callable[[str, str], bool]   # (key, method) -> allowed


def key_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for name, value in metadata or ():
        text = value.decode() if isinstance(value, bytes) else value
        if name == "authorization" and text.lower().startswith("bearer "):
            return text[7:].strip()
        if name == "x-api-key":
            return text.strip()
    return None


def as_bytes(text: str) -> bytes:
    """``text`` as UTF-8, lone surrogates included (an HTTP header's undecodable bytes arrive as such), so that
    any presented key can be compared, and fails to match, instead of raising."""
    return text.encode("utf-8", "surrogatepass")


def matches_any(key: str, keys: Iterable[str]) -> bool:
    found = False
    for candidate in keys:
        found |= hmac.compare_digest(as_bytes(key), as_bytes(candidate))
    return found


class ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call without a valid key, except to the ``exempt`` services.

    ``keys`` is a fixed set; ``extra_check`` may accept more keys per method (e.g. per-session keys)."""

    def __init__(self, keys: Iterable[str], exempt: Iterable[str] = (), extra_check: KeyCheck | None = None) -> None:
        self.keys = tuple(keys)
        self.exempt = tuple(f"/{name}/" for name in exempt)
        self.extra_check = extra_check

    def refusal_reason(self, handler_call_details: grpc.HandlerCallDetails) -> str | None:
        """Why the call is refused, or None when it may go on."""
        method = handler_call_details.method
        if method.startswith(self.exempt):
            return None
        key = key_from_metadata(handler_call_details.invocation_metadata)
        if key and (matches_any(key, self.keys) or (self.extra_check and self.extra_check(key, method))):
            return None
        return "missing API key" if not key else "invalid API key"

    def intercept_service(self, continuation, handler_call_details):
        reason = self.refusal_reason(handler_call_details)
        handler = continuation(handler_call_details)
        return handler if reason is None else _refusal(handler, reason)


class AioApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """``ApiKeyInterceptor`` for ``grpc.aio`` servers."""

    def __init__(self, keys: Iterable[str], exempt: Iterable[str] = (), extra_check: KeyCheck | None = None) -> None:
        self._check = ApiKeyInterceptor(keys, exempt, extra_check)

    async def intercept_service(self, continuation, handler_call_details):
        reason = self._check.refusal_reason(handler_call_details)
        handler = await continuation(handler_call_details)
        return handler if reason is None else _async_refusal(handler, reason)


def _refusal(handler: grpc.RpcMethodHandler | None, reason: str) -> grpc.RpcMethodHandler | None:
    if handler is None:
        return None

    def deny(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    def deny_stream(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        yield  # pragma: no cover - abort raises

    return _handler_like(handler, deny_stream if handler.response_streaming else deny)


def _handler_like(handler: grpc.RpcMethodHandler, behaviour: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same kind and (de)serialisers as ``handler`` that runs ``behaviour`` instead."""
    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(behaviour, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def _async_refusal(handler: grpc.RpcMethodHandler | None, reason: str) -> grpc.RpcMethodHandler | None:
    if handler is None:
        return None

    async def deny(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    async def deny_stream(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        yield  # pragma: no cover - abort raises

    return _handler_like(handler, deny_stream if handler.response_streaming else deny)


def bearer_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()
