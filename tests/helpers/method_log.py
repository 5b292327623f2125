"""A server interceptor that records which methods a real in-process gRPC server was asked for, implemented or not:
how the unit tests see what a client called."""

from __future__ import annotations

import grpc


class MethodLog(grpc.ServerInterceptor):
    """``methods``: the method names of ``service`` asked for, in order (every method's full path when ``service`` is
    None)."""

    def __init__(self, service: str | None = None) -> None:
        self.service = service
        self.methods: list[str] = []

    def intercept_service(self, continuation, handler_call_details):
        if self.service is None:
            self.methods.append(handler_call_details.method)
        else:
            service, _, method = handler_call_details.method.rpartition("/")
            if service == f"/{self.service}":
                self.methods.append(method)
        return continuation(handler_call_details)
