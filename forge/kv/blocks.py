"""A KV block as the L3 cache stores it: its hash, metadata and payload, the checks every block passes, and the
chunks it travels in (``forge.v1.KVBlockChunk``).

A block's payload is the raw bytes of one tensor (an actor's keys and values of one block of ``num_tokens`` tokens
in every layer); ``dtype`` and ``shape`` must account for exactly ``total_bytes``, and the SHA-256 of the payload
travels with it, so a torn or corrupted block is refused rather than served.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from forge.kvhash import DIGEST_BYTES
from forge.v1 import cache_pb2

DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1}
MAX_BLOCK_BYTES = 256 * 1024 * 1024
MAX_HASHES = 1 << 16            # block hashes one Lookup or Get request may carry (a client splits longer chains)
MAX_DIMS = 8
CHUNK_BYTES = 1024 * 1024


class InvalidBlock(ValueError):
    """A hash, a size or a payload that cannot be a KV block (the service answers INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class BlockMeta:
    block_hash: bytes
    num_tokens: int
    dtype: str
    shape: tuple[int, ...]
    total_bytes: int
    sha256: bytes

    def to_json(self) -> dict:
        return {"hash": self.block_hash.hex(), "num_tokens": self.num_tokens, "dtype": self.dtype,
                "shape": list(self.shape), "total_bytes": self.total_bytes, "sha256": self.sha256.hex()}

    @classmethod
    def from_json(cls, data: dict) -> BlockMeta:
        return cls(bytes.fromhex(data["hash"]), int(data["num_tokens"]), str(data["dtype"]),
                   tuple(int(d) for d in data["shape"]), int(data["total_bytes"]), bytes.fromhex(data["sha256"]))


@dataclass(frozen=True)
class KVBlock:
    meta: BlockMeta
    data: bytes

    @classmethod
    def build(cls, block_hash: bytes, num_tokens: int, dtype: str, shape: tuple[int, ...], data: bytes) -> KVBlock:
        """A checked block whose checksum is computed here."""
        meta = BlockMeta(bytes(block_hash), num_tokens, dtype, tuple(shape), len(data), hashlib.sha256(data).digest())
        check_meta(meta)
        return cls(meta, bytes(data))

    @property
    def block_hash(self) -> bytes:
        return self.meta.block_hash


def hash_name(block_hash: bytes) -> str:
    return block_hash.hex()[:12]


def check_hash(block_hash: bytes) -> None:
    if len(block_hash) != DIGEST_BYTES:
        raise InvalidBlock(f"a block hash has {DIGEST_BYTES} bytes (forge.kvhash); got {len(block_hash)}")


def check_hashes(hashes: Iterable[bytes]) -> list[bytes]:
    """The hashes of a request, as a list, each checked."""
    hashes = list(hashes)
    for block_hash in hashes:
        check_hash(block_hash)
    return hashes


def check_meta(meta: BlockMeta, max_bytes: int = MAX_BLOCK_BYTES) -> None:
    """Refuse a block whose metadata is inconsistent: wrong hash length, unknown dtype, a shape that does not
    account for total_bytes, a size over ``max_bytes``."""
    check_hash(meta.block_hash)
    name = hash_name(meta.block_hash)
    if meta.num_tokens <= 0:
        raise InvalidBlock(f"block {name}: num_tokens must be positive, got {meta.num_tokens}")
    if meta.dtype not in DTYPE_BYTES:
        raise InvalidBlock(f"block {name}: unknown dtype {meta.dtype!r} (one of {', '.join(DTYPE_BYTES)})")
    if not meta.shape or len(meta.shape) > MAX_DIMS or any(d <= 0 for d in meta.shape):
        raise InvalidBlock(f"block {name}: shape {list(meta.shape)} must have 1 to {MAX_DIMS} positive dimensions")
    if not 0 < meta.total_bytes <= max_bytes:
        raise InvalidBlock(f"block {name}: total_bytes {meta.total_bytes} outside (0, {max_bytes}]")
    expected = math.prod(meta.shape) * DTYPE_BYTES[meta.dtype]
    if expected != meta.total_bytes:
        raise InvalidBlock(f"block {name}: shape {list(meta.shape)} of {meta.dtype} is {expected} bytes, but "
                           f"total_bytes says {meta.total_bytes}")
    if len(meta.sha256) != 32:
        raise InvalidBlock(f"block {name}: the SHA-256 checksum has 32 bytes, got {len(meta.sha256)}")


def check_size(block: KVBlock) -> None:
    meta = block.meta
    if len(block.data) != meta.total_bytes:
        raise InvalidBlock(f"block {hash_name(meta.block_hash)}: {len(block.data)} payload bytes, "
                           f"total_bytes says {meta.total_bytes}")


def check_payload(block: KVBlock) -> None:
    """The payload's size and SHA-256, checked where a block arrives: off the wire (``Assembler``) or the disk."""
    check_size(block)
    meta = block.meta
    if hashlib.sha256(block.data).digest() != meta.sha256:
        raise InvalidBlock(f"block {hash_name(meta.block_hash)}: checksum mismatch (the payload is corrupted)")


def to_chunks(block: KVBlock, chunk_bytes: int = CHUNK_BYTES) -> Iterator[cache_pb2.KVBlockChunk]:
    meta, data = block.meta, block.data
    for offset in range(0, meta.total_bytes, chunk_bytes):
        chunk = cache_pb2.KVBlockChunk(block_hash=meta.block_hash, offset=offset, data=data[offset:offset + chunk_bytes])
        if offset == 0:
            chunk.num_tokens, chunk.dtype, chunk.total_bytes = meta.num_tokens, meta.dtype, meta.total_bytes
            chunk.shape.extend(meta.shape)
        if offset + chunk_bytes >= meta.total_bytes:
            chunk.sha256 = meta.sha256
        yield chunk


class Assembler:
    """Turns a stream of chunks back into checked blocks: ``feed`` returns a block when its last chunk arrives;
    ``finish`` refuses a stream that ends inside a block."""

    def __init__(self, max_bytes: int = MAX_BLOCK_BYTES) -> None:
        self.max_bytes = max_bytes
        self._meta: BlockMeta | None = None
        self._parts: list[bytes] = []
        self._received = 0

    def feed(self, chunk: cache_pb2.KVBlockChunk) -> KVBlock | None:
        if self._meta is None:
            check_hash(chunk.block_hash)
            if chunk.offset != 0:
                raise InvalidBlock(f"block {hash_name(chunk.block_hash)}: its first chunk starts at offset "
                                   f"{chunk.offset}, not 0")
            self._meta = BlockMeta(bytes(chunk.block_hash), chunk.num_tokens, chunk.dtype, tuple(chunk.shape),
                                   chunk.total_bytes, b"\0" * 32)
            check_meta(self._meta, self.max_bytes)
        meta = self._meta
        name = hash_name(meta.block_hash)
        if chunk.block_hash != meta.block_hash:
            raise InvalidBlock(f"block {name} ended after {self._received} of {meta.total_bytes} bytes (a chunk of "
                               f"block {hash_name(chunk.block_hash)} came next)")
        if chunk.offset != self._received:
            raise InvalidBlock(f"block {name}: chunk at offset {chunk.offset}, expected {self._received}")
        if self._received + len(chunk.data) > meta.total_bytes:
            raise InvalidBlock(f"block {name}: more than total_bytes={meta.total_bytes} bytes of payload")
        self._parts.append(chunk.data)
        self._received += len(chunk.data)
        if self._received < meta.total_bytes:
            if chunk.sha256:
                raise InvalidBlock(f"block {name}: checksum sent after {self._received} of {meta.total_bytes} bytes")
            return None
        block = KVBlock(BlockMeta(meta.block_hash, meta.num_tokens, meta.dtype, meta.shape, meta.total_bytes,
                                  bytes(chunk.sha256)), b"".join(self._parts))
        self._meta, self._parts, self._received = None, [], 0
        if len(block.meta.sha256) != 32:
            raise InvalidBlock(f"block {name}: the last chunk must carry the payload's SHA-256 (32 bytes)")
        check_payload(block)
        return block

    def finish(self) -> None:
        if self._meta is not None:
            raise InvalidBlock(f"the stream ended inside block {hash_name(self._meta.block_hash)} "
                               f"({self._received} of {self._meta.total_bytes} bytes)")
