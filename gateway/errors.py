"""The gateway's errors: each knows its HTTP status, OpenAI error type and gRPC status code, so both front ends
answer bad input with a clear 4xx / status and a message, never a crash."""

from __future__ import annotations

import grpc

from forge.pool import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PoolClosedError,
    PoolError,
    PoolFullError,
)


class GatewayError(Exception):
    status = 500
    error_type = "internal_error"
    grpc_code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}


class BadRequest(GatewayError):
    status, error_type, grpc_code = 400, "invalid_request_error", grpc.StatusCode.INVALID_ARGUMENT


class Unauthorized(GatewayError):
    status, error_type, grpc_code = 401, "authentication_error", grpc.StatusCode.UNAUTHENTICATED


class Forbidden(GatewayError):
    status, error_type, grpc_code = 403, "permission_error", grpc.StatusCode.PERMISSION_DENIED


class GlobalKeyRequired(Forbidden):
    """A per-session key used for what needs a global key. gRPC refuses it before the call, as a key not valid
    for the method, so its status there is UNAUTHENTICATED."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class NotFound(GatewayError):
    status, error_type, grpc_code = 404, "not_found_error", grpc.StatusCode.NOT_FOUND


class ModelNotServed(NotFound):
    """A model name the gateway does not serve, in OpenAI's shape (404, code ``model_not_found``)."""

    error_type = "invalid_request_error"

    def __init__(self, name: str) -> None:
        super().__init__(f"The model `{name}` does not exist.", "model", "model_not_found")


class MethodNotAllowed(GatewayError):
    status, error_type, grpc_code = 405, "invalid_request_error", grpc.StatusCode.UNIMPLEMENTED


class Conflict(GatewayError):
    status, error_type, grpc_code = 409, "conflict_error", grpc.StatusCode.FAILED_PRECONDITION


class TooLarge(GatewayError):
    status, error_type, grpc_code = 413, "invalid_request_error", grpc.StatusCode.RESOURCE_EXHAUSTED


class UpstreamFailed(GatewayError):
    """An actor failed after the call's first token: the call cannot be retried transparently."""

    status, error_type, grpc_code = 502, "upstream_error", grpc.StatusCode.UNAVAILABLE


class Unavailable(GatewayError):
    status, error_type, grpc_code = 503, "service_unavailable", grpc.StatusCode.UNAVAILABLE


class PoolUnavailable(Unavailable):
    """The pool refused or could not take a write (full disk, shut down, unreachable)."""


def from_pool_error(error: Exception) -> GatewayError:
    """The gateway error for a pool failure (a PoolError, or a transport error of a remote pool)."""
    if isinstance(error, NotFoundError):
        return NotFound(str(error))
    if isinstance(error, ConflictError):
        return Conflict(str(error))
    if isinstance(error, InvalidRequestError):
        return BadRequest(str(error))
    if isinstance(error, PoolFullError):
        return PoolUnavailable(f"the pool is full: {error}", code="pool_full")
    if isinstance(error, PoolClosedError):
        return PoolUnavailable("the pool is shutting down", code="pool_closed")
    if isinstance(error, PoolError):
        return PoolUnavailable(f"the pool failed: {error}")
    if isinstance(error, grpc.RpcError):
        return PoolUnavailable(f"the pool service is unreachable: {error.code().name}")
    return PoolUnavailable(f"the pool failed: {error}")
