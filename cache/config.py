"""Settings of a forge-cache process: the block directory, its capacity and limits, the listener and its keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge.settings import Settings, SettingsError, log_level_setting, metrics_port_setting, ready_file_setting, setting

MIB = 2**20


@dataclass(frozen=True, kw_only=True)
class CacheConfig(Settings):
    dir: Path | None = setting(None, path="dir", help="Directory holding the blocks (local, or a mounted shared file "
                               "system); one server per directory. Required.")
    capacity_bytes: int = setting(4096 * MIB, flag="capacity-mb", scale=MIB, min=MIB, unit="MiB",
                                  help="Bytes of blocks kept; the least recently used are evicted beyond it.")
    max_block_bytes: int = setting(256 * MIB, flag="max-block-mb", scale=MIB, min=MIB, unit="MiB",
                                   help="Largest block accepted.")
    chunk_bytes: int = setting(1024 * 1024, flag="chunk-kb", scale=1024, min=4 * 1024, max=65536 * 1024, unit="KiB",
                               help="Size of the chunks blocks are streamed in.")
    fsync: bool = setting(False, help="fsync every block before acknowledging it (a cache may lose recent blocks on "
                                      "power loss).")
    host: str = setting("127.0.0.1", help="Interface to bind (loopback by default).")
    port: int = setting(50055, min=0, max=65535, help="gRPC port; 0 picks a free one (see --ready-file).")
    metrics_port: int | None = metrics_port_setting()
    name: str | None = setting(None, help="Instance name in stats [default: cache-PORT].")
    api_keys: tuple[str, ...] = setting((), flag="api-key", env="FORGE_CACHE_API_KEYS", secret=True,
                                        help="Require this API key on every call (repeatable).")
    ready_file: Path | None = ready_file_setting("address, instance, pid, metrics_url")
    log_level: str = log_level_setting()

    def check(self) -> None:
        if self.dir is None:
            raise SettingsError("give --dir (the directory holding the blocks)")
