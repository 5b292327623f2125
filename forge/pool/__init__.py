"""The Data Pool: a durable LMDB store of every LLM call and session, the generation queue, and the windowed FIFO on
both sides (the pool's window fetch and the learner's batch former, ``WindowedFifo``), in process (``Pool``,
``PoolReader``) or over gRPC (``PoolClient``, ``PoolServicer``). The gateway (writer) and the learner (reader) are
both clients of this package's public names; neither reaches into its modules."""

from forge.pool.client import PoolClient
from forge.pool.config import PoolConfig
from forge.pool.errors import (
    ConflictError,
    CursorConflictError,
    InvalidRequestError,
    NotFoundError,
    PoolClosedError,
    PoolError,
    PoolFullError,
)
from forge.pool.pool import Pool, PoolReader
from forge.pool.servicer import PoolServicer, pool_binding, serve_pool
from forge.pool.sessions import SESSION_STATUS_NAMES, check_call, prepare_open
from forge.pool.window import Batch, PoolSource, WindowConfig, WindowedFifo

__all__ = [
    "SESSION_STATUS_NAMES",
    "Batch",
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
    "PoolSource",
    "WindowConfig",
    "WindowedFifo",
    "check_call",
    "pool_binding",
    "prepare_open",
    "serve_pool",
]
