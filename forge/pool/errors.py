"""The Data Pool's exceptions and their gRPC status codes (the service maps them one way, the client back)."""

from __future__ import annotations

import grpc


class PoolError(Exception):
    """Base of every pool error; on its own: an internal failure (the pool is left unchanged)."""


class PoolFullError(PoolError):
    """The disk (or the configured maximum map size) is full; nothing of the failed request was recorded."""


class PoolClosedError(PoolError):
    """The pool was closed (or is shutting down) and takes no more requests."""


class InvalidRequestError(PoolError, ValueError):
    """A malformed request: wrong lengths, bad ids, bad arguments. Nothing was recorded."""


class NotFoundError(InvalidRequestError):
    """An unknown session, call or queue position."""


class ConflictError(InvalidRequestError):
    """A request that does not fit the pool's state: a closed session, an out-of-order call index, an entry that is
    not consumable, a stale cursor. Nothing was recorded."""


class CursorConflictError(ConflictError):
    """The cursor moved since the caller read it (``expected_seq`` did not match)."""


_CODES: tuple[tuple[type[PoolError], grpc.StatusCode], ...] = (
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (CursorConflictError, grpc.StatusCode.ABORTED),
    (ConflictError, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (PoolFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PoolClosedError, grpc.StatusCode.UNAVAILABLE),
    (PoolError, grpc.StatusCode.INTERNAL),
)


def status_code(error: PoolError) -> grpc.StatusCode:
    return next(code for kind, code in _CODES if isinstance(error, kind))


def error_for_status(code: grpc.StatusCode, message: str) -> PoolError | None:
    """The pool exception a gRPC status stands for (None for codes the pool does not use, e.g. UNAUTHENTICATED)."""
    for kind, known in _CODES:
        if known == code:
            return kind(message)
    return None
