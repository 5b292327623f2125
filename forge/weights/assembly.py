"""One version being received: its buffer (the only allocation), which chunks are needed, in flight or received,
and the verification of every received chunk on a thread pool while the next ones arrive."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Executor, Future, wait

import torch

from forge.weights import hashing
from forge.weights.manifest import Manifest


class Assembly:
    """Chunks of ``manifest`` land in ``buffer`` at their offsets; tensors are views of it once all are verified."""

    def __init__(self, manifest: Manifest, buffer: torch.Tensor, verifier: Executor) -> None:
        if buffer.dtype != torch.uint8 or buffer.numel() != manifest.total_bytes:
            raise ValueError("the buffer must be uint8 with the version's total size")
        self.manifest = manifest
        self.buffer = buffer
        self.started = time.perf_counter()
        self.needed: deque[int] = deque(range(manifest.num_chunks))
        self.inflight: set[int] = set()
        self.received = 0
        self.paused = False
        self.failed_chunk: int | None = None
        self._array = buffer.numpy()
        self._verifier = verifier
        self._checks: list[Future] = []

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def complete(self) -> bool:
        return self.received == self.manifest.num_chunks

    def take(self) -> int | None:
        """The next chunk to request, now counted in flight."""
        if self.paused or not self.needed:
            return None
        index = self.needed.popleft()
        self.inflight.add(index)
        return index

    def give_back(self, index: int) -> None:
        if index in self.inflight:
            self.inflight.discard(index)
            self.needed.appendleft(index)

    def requeue_inflight(self) -> None:
        for index in sorted(self.inflight, reverse=True):
            self.needed.appendleft(index)
        self.inflight.clear()

    def target(self, index: int) -> memoryview:
        """Where chunk ``index``'s bytes go: a writable view of the buffer."""
        start, end = self.manifest.chunk_range(index)
        return memoryview(self._array[start:end])

    def landed(self, index: int, intact: bool) -> None:
        """Chunk ``index`` was written to its target (``intact``: with exactly the expected length)."""
        self.inflight.discard(index)
        if not intact:
            self.failed_chunk = index
            return
        self.received += 1
        self._checks.append(self._verifier.submit(self._check, index))

    def _check(self, index: int) -> None:
        start, end = self.manifest.chunk_range(index)
        digest = hashing.hash_parts(self.manifest.hash_algorithm, (self._array[start:end],))
        if digest != self.manifest.chunk_hashes[index]:
            self.failed_chunk = index

    def verified(self) -> bool:
        """Wait for the outstanding checks; true when every chunk matched its hash (the manifest, whole-version
        hash included, was verified when it was parsed)."""
        wait(self._checks)
        return self.complete and self.failed_chunk is None

    def cancel(self) -> None:
        for check in self._checks:
            check.cancel()

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for spec in self.manifest.tensors:
            if spec.nbytes:
                out[spec.name] = self.buffer[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).view(spec.shape)
            else:
                out[spec.name] = torch.empty(spec.shape, dtype=spec.dtype)
        return out
