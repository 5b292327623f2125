"""The L3 cache's storage: one file per KV block in a local or mounted directory, an in-memory LRU index over
them, and eviction of the least recently used blocks at capacity.

Why files and not LMDB: the directory is meant to be a shared mount (a DFS in production), where mmap and the
file locks LMDB depends on are unreliable; a block is written once, read whole and never updated, which a file
does well; a block can be megabytes; and the files themselves are the state, so nothing else must be kept
consistent with them. Layout: ``DIR/blocks/ab/<32 hex digits>.kvb`` holding a magic, a JSON header (hash, dtype,
shape, size, SHA-256) and the payload. A block is written to a temporary file and renamed into place, so a crash
never leaves half a block under a real name. At start the directory is scanned (headers only) and the LRU order
is rebuilt from modification times, which reads refresh. One server owns a directory (a lock file says so).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from forge.kv.blocks import BlockMeta, InvalidBlock, KVBlock, check_meta, check_payload, check_size, hash_name
from forge.kvhash import leading

log = logging.getLogger(__name__)

MAGIC = b"FKV1"
SUFFIX = ".kvb"
_HEAD = struct.Struct("<4sI")
_TOUCH_EVERY_S = 30.0
_names = itertools.count()


class DirectoryInUse(RuntimeError):
    """Another cache server holds this directory."""


@dataclass
class _Entry:
    meta: BlockMeta
    file_bytes: int
    touched: float


def _encode_header(meta: BlockMeta) -> bytes:
    header = json.dumps(meta.to_json(), separators=(",", ":")).encode()
    return _HEAD.pack(MAGIC, len(header)) + header


def _read_header(handle) -> tuple[BlockMeta, int]:
    magic, length = _HEAD.unpack(handle.read(_HEAD.size))
    if magic != MAGIC or length > 1 << 16:
        raise ValueError("not a Forge KV block file")
    return BlockMeta.from_json(json.loads(handle.read(length))), _HEAD.size + length


class BlockStore:
    def __init__(self, directory: str | Path, capacity_bytes: int, fsync: bool = False) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.root = Path(directory)
        self.blocks_dir = self.root / "blocks"
        self.blocks_dir.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self._lock_file = open(self.root / "LOCK", "a+")  # noqa: SIM115 - held for the store's lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_file.close()
            raise DirectoryInUse(f"{self.root} is used by another cache server (one server per directory)") from exc
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, _Entry] = OrderedDict()
        self.used_bytes = 0
        self.evictions = 0
        self.dropped_files = 0
        self._load()

    def path_of(self, block_hash: bytes) -> Path:
        name = block_hash.hex()
        return self.blocks_dir / name[:2] / f"{name}{SUFFIX}"

    def _load(self) -> None:
        found: list[tuple[float, BlockMeta, int]] = []
        for path in self.blocks_dir.glob("*/*"):
            if not path.name.endswith(SUFFIX):
                path.unlink(missing_ok=True)            # a temporary file left by a crash
                continue
            try:
                with path.open("rb") as handle:
                    meta, header_bytes = _read_header(handle)
                check_meta(meta)
                stat = path.stat()
                if path.name != f"{meta.block_hash.hex()}{SUFFIX}" or stat.st_size != header_bytes + meta.total_bytes:
                    raise ValueError("name or size does not match the header")
            except (OSError, ValueError, KeyError, InvalidBlock, struct.error) as exc:
                log.warning("dropping unreadable block file %s: %s", path, exc)
                self.dropped_files += 1
                path.unlink(missing_ok=True)
                continue
            found.append((stat.st_mtime, meta, stat.st_size))
        for mtime, meta, size in sorted(found, key=lambda f: f[0]):
            self._index[meta.block_hash] = _Entry(meta, size, mtime)
            self.used_bytes += size
        with self._lock:
            self._evict_to(self.capacity_bytes)
        log.info("block store %s: %d blocks, %.1f MiB of %.1f MiB", self.root, len(self._index),
                 self.used_bytes / 2**20, self.capacity_bytes / 2**20)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def prefix_length(self, hashes: list[bytes]) -> int:
        """How many leading hashes of a chain are stored."""
        with self._lock:
            return leading(hashes, self._index.__contains__)

    def put(self, block: KVBlock) -> bool:
        """Store a block; False when it is already stored. Evicts least recently used blocks to fit. Its checksum
        is not computed again: ``KVBlock.build`` computed it and the service's ``Assembler`` verified it; a block
        whose payload does not match it is dropped when read, never served."""
        meta = block.meta
        check_meta(meta)
        check_size(block)
        header = _encode_header(meta)
        size = len(header) + meta.total_bytes
        if size > self.capacity_bytes:
            raise InvalidBlock(f"block {hash_name(meta.block_hash)} of {size} bytes exceeds the cache's capacity of "
                               f"{self.capacity_bytes} bytes")
        with self._lock:
            if meta.block_hash in self._index:
                self._index.move_to_end(meta.block_hash)
                return False
        path = self.path_of(meta.block_hash)
        path.parent.mkdir(exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.{next(_names)}.tmp")
        with temporary.open("wb") as handle:
            handle.write(header)
            handle.write(block.data)
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
        with self._lock:
            if meta.block_hash in self._index:
                return False
            self._index[meta.block_hash] = _Entry(meta, size, time.time())
            self.used_bytes += size
            self._evict_to(self.capacity_bytes, keep=meta.block_hash)
        return True

    def get(self, block_hash: bytes) -> KVBlock | None:
        """The block, or None when it is not stored (or its file turns out corrupted, which drops it)."""
        with self._lock:
            entry = self._index.get(block_hash)
            if entry is None:
                return None
            self._index.move_to_end(block_hash)
            now = time.time()
            touch = now - entry.touched > _TOUCH_EVERY_S
            if touch:
                entry.touched = now
        path = self.path_of(block_hash)
        try:
            with path.open("rb") as handle:
                meta, _ = _read_header(handle)
                block = KVBlock(meta, handle.read())
            check_payload(block)
            if touch:
                os.utime(path)
        except FileNotFoundError:
            return None                                  # evicted meanwhile
        except (OSError, ValueError, KeyError, InvalidBlock, struct.error) as exc:
            log.error("block %s is corrupted on disk (%s): dropping it", hash_name(block_hash), exc)
            self.discard(block_hash)
            return None
        return block

    def discard(self, block_hash: bytes) -> None:
        with self._lock:
            entry = self._index.pop(block_hash, None)
            if entry is not None:
                self.used_bytes -= entry.file_bytes
        self.path_of(block_hash).unlink(missing_ok=True)

    def _evict_to(self, limit: int, keep: bytes | None = None) -> None:
        while self.used_bytes > limit and self._index:
            block_hash, entry = next(iter(self._index.items()))
            if block_hash == keep:
                break
            del self._index[block_hash]
            self.used_bytes -= entry.file_bytes
            self.evictions += 1
            self.path_of(block_hash).unlink(missing_ok=True)

    def close(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
