"""Client channels to Forge services: one place for message limits, keepalive and the API key."""

from __future__ import annotations

import grpc

from forge.rpc.auth import bearer_metadata


class _KeyInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                      grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, api_key: str) -> None:
        self.metadata = bearer_metadata(api_key)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return details._replace(metadata=(*(details.metadata or ()), *self.metadata))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def check_address(address: str) -> str:
    """``address`` if it is HOST:PORT (an IPv6 host in brackets, a port in 1..65535); raises ValueError saying why
    not. Loads and contacts nothing."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{address!r}: write an IPv6 host in brackets, e.g. [::1]:50051")
    return address


def check_addresses(addresses: tuple[str, ...] | list[str]) -> None:
    for address in addresses:
        check_address(address)


def connect(address: str, api_key: str | None = None, max_message_bytes: int = 256 * 1024 * 1024) -> grpc.Channel:
    """An insecure channel to ``address`` (host:port) that sends ``api_key`` with every call when given."""
    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
    ])
    return grpc.intercept_channel(channel, _KeyInterceptor(api_key)) if api_key else channel
