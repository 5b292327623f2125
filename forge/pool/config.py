"""Settings of a pool: storage, the entry failure policy, retention of consumed records, housekeeping."""

from __future__ import annotations

from dataclasses import dataclass

from forge.pool.store import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE


@dataclass
class PoolConfig:
    map_size: int = DEFAULT_MAP_SIZE            # initial LMDB map; grows by doubling when full
    max_map_size: int = DEFAULT_MAX_MAP_SIZE    # beyond this the pool is full (PoolFullError)
    sync: bool = True                           # fsync every commit before acknowledging (never off in production)
    max_batch: int = 1024                       # most requests committed in one transaction
    min_completed: int = 1                      # an entry whose group has fewer completed sessions is FAILED
    keep_consumed: int | None = None            # keep at most this many consumed entries (None: no limit)
    keep_consumed_s: float | None = None        # delete consumed entries older than this (None: no limit)
    retention_batch: int = 256                  # most entries one retention pass deletes
    session_timeout_s: float | None = None      # housekeeping expires sessions idle this long (None: never)
    housekeeping_s: float = 10.0                # how often housekeeping (expiry, retention) runs

    @property
    def retains_everything(self) -> bool:
        return self.keep_consumed is None and self.keep_consumed_s is None
