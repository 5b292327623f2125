"""API keys on gRPC: a server interceptor that refuses calls without a valid key, and the client side that sends
one. Keys travel in the ``authorization: Bearer <key>`` metadata (``x-api-key`` is accepted too); they are compared
in constant time and never logged."""

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


def matches_any(key: str, keys: Iterable[str]) -> bool:
    found = False
    for candidate in keys:
        found |= hmac.compare_digest(key.encode(), candidate.encode())
    return found


class ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call without a valid key, except to the ``exempt`` services.

    ``keys`` is a fixed set; ``extra_check`` may accept more keys per method (e.g. per-session keys)."""

    def __init__(self, keys: Iterable[str], exempt: Iterable[str] = (), extra_check: KeyCheck | None = None) -> None:
        self.keys = tuple(keys)
        self.exempt = tuple(f"/{name}/" for name in exempt)
        self.extra_check = extra_check

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(self.exempt):
            return continuation(handler_call_details)
        key = key_from_metadata(handler_call_details.invocation_metadata)
        if key and (matches_any(key, self.keys) or (self.extra_check and self.extra_check(key, method))):
            return continuation(handler_call_details)
        reason = "missing API key" if not key else "invalid API key"
        return _refusal(continuation(handler_call_details), reason)


def _refusal(handler: grpc.RpcMethodHandler | None, reason: str) -> grpc.RpcMethodHandler | None:
    if handler is None:
        return None

    def deny(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    def deny_stream(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        yield  # pragma: no cover - abort raises

    kind = (handler.request_streaming, handler.response_streaming)
    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kind]
    return factory(deny_stream if handler.response_streaming else deny,
                   request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def bearer_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()
