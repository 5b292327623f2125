"""A version ready to serve: the state dict checked and laid out in the flat byte space, GPU or non-contiguous
tensors staged to CPU once (contiguous CPU tensors are served in place, without a copy), every chunk cut into
buffer slices for zero-copy sends, and every chunk hashed on a thread pool. A version already received and verified
(a relay's) is served from its receive buffer under its original manifest, without hashing again (``received``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from forge.v1 import weights_pb2
from forge.weights import hashing
from forge.weights.buffers import allocate
from forge.weights.manifest import ALIGNMENT, MAX_CHUNK_SIZE, MAX_VERSION, Manifest, align, layout, seal

_ZEROS = np.zeros(ALIGNMENT, dtype=np.uint8)


@dataclass(frozen=True)
class ServedVersion:
    """One published version: its manifest, the buffers of every chunk, and the serialized manifest reply;
    ``keepalive``: what the chunks' memory belongs to (a relay's receive buffer), held for as long as it is served."""

    manifest: Manifest
    chunks: tuple[tuple[np.ndarray, ...], ...]
    manifest_reply: bytes
    keepalive: object = field(default=None, repr=False, compare=False)

    @property
    def version(self) -> int:
        return self.manifest.version


def check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"version must be an int, got {type(version).__name__}")
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"version {version} is outside [0, 2**63 - 1]")
    return version


def check_chunk_size(chunk_size: object) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size must be an int in [1, {MAX_CHUNK_SIZE}], got {chunk_size!r}")
    return chunk_size


def check_state_dict(state_dict: object) -> dict[str, torch.Tensor]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of name to torch.Tensor, got {type(state_dict).__name__}")
    if not state_dict:
        raise ValueError("state_dict is empty: nothing to publish")
    checked = {}
    for name, value in state_dict.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"state_dict keys must be non-empty strings, got {name!r}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is a {type(value).__name__}, not a torch.Tensor")
        if value.layout != torch.strided or value.is_quantized or value.is_nested or value.is_meta:
            raise ValueError(f"state_dict[{name!r}] must be a dense tensor with data (got layout {value.layout}, "
                             f"device {value.device})")
        checked[name] = value.detach()
    return checked


def _served_in_place(tensor: torch.Tensor, copy: bool) -> bool:
    return (not copy and tensor.device.type == "cpu" and tensor.is_contiguous()
            and not tensor.is_conj() and not tensor.is_neg())


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _stage(tensors: dict[str, torch.Tensor], names: list[str], pin_memory: bool) -> dict[str, np.ndarray]:
    """Copy ``names`` into one CPU buffer (pinned when asked), once; returns each one's bytes."""
    offsets, total = {}, 0
    for name in names:
        total = align(total)
        offsets[name] = total
        total += tensors[name].nbytes
    staging = allocate(total, pin_memory and torch.cuda.is_available())
    views, devices = {}, set()
    for name in names:
        source = tensors[name]
        target = staging[offsets[name]:offsets[name] + source.nbytes].view(source.dtype).reshape(source.shape)
        target.copy_(source, non_blocking=staging.is_pinned() and source.is_cuda)
        if source.is_cuda:
            devices.add(source.device)
        views[name] = _bytes_of(target)
    for device in devices:
        torch.cuda.synchronize(device)
    return views


def _cut(flat: list[tuple[int, np.ndarray]], total: int, chunk_size: int) -> list[tuple[np.ndarray, ...]]:
    """Slices of the tensors' bytes (and zero padding between them) that make up each chunk, in order."""
    chunks: list[tuple[np.ndarray, ...]] = []
    position, item = 0, 0
    for index in range(math.ceil(total / chunk_size)):
        end = min((index + 1) * chunk_size, total)
        parts = []
        while position < end:
            offset, data = flat[item]
            if position < offset:
                step = min(offset, end) - position
                parts.append(_ZEROS[:step])
            else:
                step = min(offset + data.size, end) - position
                parts.append(data[position - offset:position - offset + step])
                if position + step == offset + data.size:
                    item += 1
            position += step
        chunks.append(tuple(parts))
    return chunks


def prepare(version: int, state_dict: Mapping[str, torch.Tensor], *, chunk_size: int, hash_algorithm: str,
            executor: Executor, copy: bool = False, pin_memory: bool = False, publisher_id: str = "") -> ServedVersion:
    """Build the served form of ``state_dict`` as ``version``."""
    tensors = check_state_dict(state_dict)
    to_stage = [name for name, t in tensors.items() if t.nbytes and not _served_in_place(t, copy)]
    data = _stage(tensors, to_stage, pin_memory) if to_stage else {}
    specs, total = layout([(name, t.dtype, tuple(t.shape), t.nbytes) for name, t in tensors.items()])
    flat = []
    for spec in specs:
        if spec.nbytes:
            flat.append((spec.offset, data[spec.name] if spec.name in data else _bytes_of(tensors[spec.name])))
    chunks = _cut(flat, total, chunk_size)
    hashes = list(executor.map(partial(hashing.hash_parts, hash_algorithm), chunks))
    manifest = seal(version, specs, total, chunk_size, hash_algorithm, hashes, publisher_id)
    return ServedVersion(manifest, tuple(chunks), encode_manifest_reply(manifest))


def encode_manifest_reply(manifest: Manifest) -> bytes:
    """The serialized answer to a manifest request for ``manifest``."""
    reply = weights_pb2.WeightReply(status=weights_pb2.WEIGHT_STATUS_OK, latest_version=manifest.version,
                                    manifest=manifest.to_proto())
    return reply.SerializeToString()


def received(manifest: Manifest, buffer: torch.Tensor) -> ServedVersion:
    """The served form of a version that was received and verified into ``buffer`` (uint8, the version's flat
    byte space): each chunk is one slice of the buffer, served under ``manifest`` as it is (its chunk hashes and
    whole-version hash are the original publisher's: nothing is hashed again, so whoever fetches it verifies it
    end to end against what that publisher published). The buffer is held while the version is served."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise TypeError("the buffer must be a one-dimensional uint8 tensor")
    if buffer.numel() != manifest.total_bytes:
        raise ValueError(f"the buffer holds {buffer.numel()} bytes; version {manifest.version} has "
                         f"{manifest.total_bytes}")
    if buffer.device.type != "cpu" or not buffer.is_contiguous():
        raise ValueError("the buffer must be a contiguous CPU tensor")
    data = buffer.numpy()
    chunks = []
    for index in range(manifest.num_chunks):
        start, end = manifest.chunk_range(index)
        chunks.append((data[start:end],))
    return ServedVersion(manifest, tuple(chunks), encode_manifest_reply(manifest), keepalive=buffer)
