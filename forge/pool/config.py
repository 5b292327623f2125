"""Settings of a pool: storage, the entry failure policy, retention of consumed records, housekeeping."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forge.pool.last_calls import DEFAULT_BYTES as DEFAULT_LAST_CALLS_BYTES
from forge.pool.store import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE
from forge.settings import Settings, SettingsError, log_level_setting, metrics_port_setting, ready_file_setting, setting

DEFAULT_PORT = 50057


@dataclass(frozen=True, kw_only=True)
class PoolConfig(Settings):
    map_size: int = setting(DEFAULT_MAP_SIZE, click_type="bytes", min=1 << 16,
                            help="Initial LMDB map size (it doubles when full), e.g. 64MiB.")
    max_map_size: int = setting(DEFAULT_MAX_MAP_SIZE, click_type="bytes", min=1 << 16,
                                help="Largest map: beyond it appends fail with RESOURCE_EXHAUSTED.")
    sync: bool = True                           # fsync every commit before acknowledging (never off in production)
    max_batch: int = 1024                       # most requests committed in one transaction
    last_calls_bytes: int = setting(DEFAULT_LAST_CALLS_BYTES, click_type="bytes", min=0,
                                    help="Memory for open sessions' last call ids, so that recording a call costs its "
                                         "new tokens, not its context (0: read them back from storage each time).")
    min_completed: int = setting(1, min=1, help="A group with fewer completed sessions becomes a FAILED entry.")
    keep_consumed: int | None = setting(None, min=0, help="Keep the records of at most this many consumed entries "
                                                          "[default: all].")
    keep_consumed_s: float | None = setting(None, min=0, help="Delete the records of entries consumed longer ago "
                                                              "than this (seconds).")
    retention_batch: int = 256                  # most entries one retention pass deletes
    session_timeout_s: float | None = setting(None, flag="session-timeout", min=0, min_open=True,
                                              help="Close sessions idle this many seconds as failed ('timeout').")
    housekeeping_s: float = 10.0                # how often housekeeping (expiry, retention) runs

    def check(self) -> None:
        if self.max_map_size < self.map_size:
            raise SettingsError(f"--max-map-size ({self.max_map_size}) is below --map-size ({self.map_size})")

    @property
    def retains_everything(self) -> bool:
        return self.keep_consumed is None and self.keep_consumed_s is None


@dataclass(frozen=True, kw_only=True)
class PoolServeConfig(Settings):
    """``forge pool serve``: one pool directory behind the forge.v1.Pool gRPC service."""

    path: Path | None = setting(None, path="dir", help="Pool directory (created if missing). Required.")
    host: str = setting("127.0.0.1", help="Address to bind (loopback by default).")
    port: int = setting(DEFAULT_PORT, min=0, max=65535, help="Port to bind (0: any free port).")
    metrics_port: int | None = metrics_port_setting()
    api_keys: tuple[str, ...] = setting((), flag="api-key", secret=True,
                                        help="Accept only calls with this key (repeatable; health checks exempt).")
    ready_file: Path | None = ready_file_setting("address, kind, pid, metrics_url")
    log_level: str = log_level_setting()
    storage: PoolConfig = field(default_factory=PoolConfig)

    def check(self) -> None:
        if self.path is None:
            raise SettingsError("give --path (the pool directory)")
