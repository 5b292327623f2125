"""The Data Pool: a durable LMDB store of every LLM call and session, the generation queue, and the learner's
windowed-FIFO consumer API, in process (``Pool``, ``PoolReader``) or over gRPC (``PoolClient``, ``PoolServicer``)."""

from forge.gateway.pool.client import PoolClient
from forge.gateway.pool.config import PoolConfig
from forge.gateway.pool.errors import (
    ConflictError,
    CursorConflictError,
    InvalidRequestError,
    NotFoundError,
    PoolClosedError,
    PoolError,
    PoolFullError,
)
from forge.gateway.pool.pool import Pool, PoolReader
from forge.gateway.pool.service import PoolServicer, pool_binding, serve_pool

__all__ = [
    "ConflictError",
    "CursorConflictError",
    "InvalidRequestError",
    "NotFoundError",
    "Pool",
    "PoolClient",
    "PoolClosedError",
    "PoolConfig",
    "PoolError",
    "PoolFullError",
    "PoolReader",
    "PoolServicer",
    "pool_binding",
    "serve_pool",
]
