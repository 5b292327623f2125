"""Chunk hashes: the algorithms a manifest may name, and hashing a chunk given as a sequence of byte buffers.

Every algorithm here releases the GIL on large buffers, so chunks hash in parallel on a thread pool."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterable
from typing import Any

Buffer = Any   # anything with the buffer protocol: bytes, memoryview, a numpy array


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Buffer) -> None:
        self.value = zlib.crc32(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


_FACTORIES: dict[str, tuple[Callable[[], Any], int]] = {
    "sha256": (hashlib.sha256, 32),
    "blake2b": (lambda: hashlib.blake2b(digest_size=32), 32),
    "sha1": (hashlib.sha1, 20),
    "crc32": (_Crc32, 4),
}
ALGORITHMS = tuple(_FACTORIES)
DEFAULT_ALGORITHM = "crc32"


def check_algorithm(name: str) -> str:
    if name not in _FACTORIES:
        raise ValueError(f"unknown hash algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return name


def digest_size(algorithm: str) -> int:
    return _FACTORIES[check_algorithm(algorithm)][1]


def hash_parts(algorithm: str, parts: Iterable[Buffer]) -> bytes:
    """The hash of the concatenation of ``parts`` (without concatenating them)."""
    state = _FACTORIES[algorithm][0]()
    for part in parts:
        state.update(part)
    return state.digest()


def version_hash(canonical: bytes) -> bytes:
    """The whole-version hash: always sha256, over the manifest's canonical encoding (small)."""
    return hashlib.sha256(canonical).digest()
