"""The manifest of a weight version: its tensors' layout in one flat byte space, its chunking and its hashes;
conversion to and from the wire message, the canonical encoding behind the whole-version hash, and validation."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from forge.v1 import weights_pb2
from forge.weights import hashing

ALIGNMENT = 64
MAX_CHUNK_SIZE = 1 << 30
MAX_VERSION = (1 << 63) - 1
_MAGIC = b"forge.v1.weights\0"


class ManifestError(ValueError):
    """A manifest that is inconsistent with itself or with its whole-version hash."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ManifestError(f"unknown dtype {name!r}")
    return dtype


def align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    version: int
    tensors: tuple[TensorSpec, ...]
    total_bytes: int
    chunk_size: int
    hash_algorithm: str
    chunk_hashes: tuple[bytes, ...]
    version_hash: bytes
    publisher_id: str = ""

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_hashes)

    def chunk_range(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.total_bytes)

    def to_proto(self) -> weights_pb2.WeightManifest:
        return weights_pb2.WeightManifest(
            version=self.version,
            tensors=[weights_pb2.WeightTensor(name=t.name, dtype=dtype_name(t.dtype), shape=t.shape,
                                              offset=t.offset, nbytes=t.nbytes) for t in self.tensors],
            total_bytes=self.total_bytes, chunk_size=self.chunk_size, hash_algorithm=self.hash_algorithm,
            chunk_hashes=self.chunk_hashes, version_hash=self.version_hash, publisher_id=self.publisher_id)

    @classmethod
    def from_proto(cls, message: weights_pb2.WeightManifest) -> Manifest:
        """Parse and validate a received manifest; raises ManifestError when anything does not add up."""
        tensors = tuple(TensorSpec(t.name, dtype_from_name(t.dtype), tuple(t.shape), t.offset, t.nbytes)
                        for t in message.tensors)
        manifest = cls(message.version, tensors, message.total_bytes, message.chunk_size, message.hash_algorithm,
                       tuple(message.chunk_hashes), message.version_hash, message.publisher_id)
        manifest.validate()
        return manifest

    def validate(self) -> None:
        if not 0 <= self.version <= MAX_VERSION:
            raise ManifestError(f"version {self.version} out of range")
        if self.hash_algorithm not in hashing.ALGORITHMS:
            raise ManifestError(f"unknown hash algorithm {self.hash_algorithm!r}")
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise ManifestError(f"chunk size {self.chunk_size} out of range")
        if self.num_chunks != math.ceil(self.total_bytes / self.chunk_size):
            raise ManifestError(f"{self.num_chunks} chunk hashes for {self.total_bytes} bytes")
        size = hashing.digest_size(self.hash_algorithm)
        if any(len(h) != size for h in self.chunk_hashes):
            raise ManifestError(f"chunk hashes must be {size} bytes for {self.hash_algorithm}")
        end = 0
        names: set[str] = set()
        for spec in self.tensors:
            if spec.name in names:
                raise ManifestError(f"tensor {spec.name!r} listed twice")
            names.add(spec.name)
            if any(d < 0 for d in spec.shape):
                raise ManifestError(f"tensor {spec.name!r} has a negative dimension")
            if spec.nbytes != math.prod(spec.shape) * spec.dtype.itemsize:
                raise ManifestError(f"tensor {spec.name!r}: {spec.nbytes} bytes do not match its dtype and shape")
            if spec.nbytes == 0:
                if spec.offset:
                    raise ManifestError(f"tensor {spec.name!r}: an empty tensor has offset 0")
                continue
            if spec.offset % ALIGNMENT or spec.offset < end or spec.offset + spec.nbytes > self.total_bytes:
                raise ManifestError(f"tensor {spec.name!r}: bad offset {spec.offset}")
            end = spec.offset + spec.nbytes
        if end != self.total_bytes:
            raise ManifestError(f"total size {self.total_bytes} does not end at the last tensor ({end})")
        if self.version_hash != hashing.version_hash(canonical_bytes(self)):
            raise ManifestError(f"version {self.version}: whole-version hash does not match the manifest")


def layout(entries: Sequence[tuple[str, torch.dtype, tuple[int, ...], int]]) -> tuple[list[TensorSpec], int]:
    """Place (name, dtype, shape, nbytes) entries at aligned offsets, in order (empty tensors at 0, taking no
    space); returns the specs and the total bytes."""
    specs, offset = [], 0
    for name, dtype, shape, nbytes in entries:
        start = align(offset) if nbytes else 0
        specs.append(TensorSpec(name, dtype, shape, start, nbytes))
        offset = start + nbytes if nbytes else offset
    return specs, offset


def canonical_bytes(manifest: Manifest) -> bytes:
    """The unambiguous encoding of a manifest's fields 1-6 that the whole-version hash is taken over."""
    algorithm = manifest.hash_algorithm.encode()
    out = [_MAGIC, struct.pack("<qQIH", manifest.version, manifest.total_bytes, manifest.chunk_size, len(algorithm)),
           algorithm, struct.pack("<I", len(manifest.tensors))]
    for spec in manifest.tensors:
        name, dtype = spec.name.encode(), dtype_name(spec.dtype).encode()
        out += [struct.pack("<I", len(name)), name, struct.pack("<H", len(dtype)), dtype,
                struct.pack(f"<I{len(spec.shape)}q", len(spec.shape), *spec.shape),
                struct.pack("<QQ", spec.offset, spec.nbytes)]
    out.append(struct.pack("<I", manifest.num_chunks))
    out.extend(manifest.chunk_hashes)
    return b"".join(out)


def seal(version: int, tensors: Sequence[TensorSpec], total_bytes: int, chunk_size: int, hash_algorithm: str,
         chunk_hashes: Sequence[bytes], publisher_id: str = "") -> Manifest:
    """A manifest with its whole-version hash computed."""
    unsealed = Manifest(version, tuple(tensors), total_bytes, chunk_size, hash_algorithm, tuple(chunk_hashes), b"",
                        publisher_id)
    return replace(unsealed, version_hash=hashing.version_hash(canonical_bytes(unsealed)))
