"""The sampler adapters the Tinker server has published to its actors: at most ``capacity`` at once (what the actors
serve from their adapter source), the least recently used one that no sample is using evicted to make room, and
published again, under a newer version, when it is sampled again.

Each sampler path is served under a name of its own (``adapter_name``: a digest, since a path is longer than an
adapter name may be and holds characters one may not), and under the version of the bundle that added it, which
only grows (``VersionClock``: unique and newer than any before, across restarts of the server too, because an actor
that kept running ignores versions older than the one it has)."""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forge.model.adapter_bundle import encode_bundle

if TYPE_CHECKING:
    from torch import Tensor


def adapter_name(sampler_path: str) -> str:
    """The adapter name a sampler path is served under on the actors."""
    return "tinker-" + hashlib.sha256(sampler_path.encode()).hexdigest()[:40]


class VersionClock:
    """Versions that only grow: microseconds since the epoch, or one more than the last given when that is later."""

    def __init__(self) -> None:
        self.last = -1

    def next(self) -> int:
        self.last = max(self.last + 1, time.time_ns() // 1000)
        return self.last


@dataclass(eq=False)
class PublishedAdapter:
    """A sampler path's adapter as it is published: its name and version in the bundles, its tensors (an adapter
    version, ``forge.model.lora_weights``) and what the model it was saved from is (``types.ModelInfo``)."""

    path: str
    name: str
    version: int
    tensors: dict[str, Tensor]
    info: Any = None
    in_use: int = 0                     # samples running with it: it is not evicted while any is
    last_used: int = field(default=0)   # a tick of the set's clock: when a sample last took or gave it back
    retired: bool = False               # its checkpoint was deleted or replaced: dropped once no sample uses it


class AdapterSet:
    """The adapters in the bundle, by sampler path (not thread-safe: the sampler holds its lock around each use)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the capacity must be 1 or more, got {capacity}")
        self.capacity = capacity
        self._by_path: dict[str, PublishedAdapter] = {}
        self._ticks = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_path)

    def __contains__(self, path: str) -> bool:
        return path in self._by_path

    def names(self) -> dict[str, str]:
        """Each sampler path in the set and the adapter name it is served under."""
        return {path: adapter.name for path, adapter in self._by_path.items()}

    def get(self, path: str) -> PublishedAdapter | None:
        return self._by_path.get(path)

    def use(self, adapter: PublishedAdapter) -> None:
        adapter.in_use += 1
        adapter.last_used = next(self._ticks)

    def release(self, adapter: PublishedAdapter) -> None:
        adapter.in_use -= 1
        adapter.last_used = next(self._ticks)       # used until now

    def can_add(self) -> bool:
        """There is room, or an adapter no sample uses that can be evicted for it."""
        return len(self._by_path) < self.capacity or self.victim() is not None

    def victim(self) -> PublishedAdapter | None:
        """The least recently used adapter no sample uses (None: every one is in use)."""
        idle = [adapter for adapter in self._by_path.values() if adapter.in_use == 0]
        return min(idle, key=lambda adapter: adapter.last_used, default=None)

    def add(self, path: str, tensors: dict[str, Tensor], version: int, info: Any = None
            ) -> tuple[PublishedAdapter, PublishedAdapter | None]:
        """Put ``path``'s adapter in, evicting the least recently used idle one when the set is full; returns the new
        adapter and the evicted one. ValueError when it is full of adapters in use (check ``can_add`` first)."""
        evicted = None
        if len(self._by_path) >= self.capacity:
            evicted = self.victim()
            if evicted is None:
                raise ValueError(f"all {self.capacity} published adapters are in use")
            del self._by_path[evicted.path]
        adapter = PublishedAdapter(path, adapter_name(path), version, tensors, info)
        self._by_path[path] = adapter
        return adapter, evicted

    def put_back(self, adapter: PublishedAdapter, evicted: PublishedAdapter | None) -> None:
        """Undo ``add`` (its bundle could not be published)."""
        del self._by_path[adapter.path]
        if evicted is not None:
            self._by_path[evicted.path] = evicted

    def remove(self, path: str) -> PublishedAdapter | None:
        return self._by_path.pop(path, None)

    def bundle(self) -> dict[str, Tensor]:
        """The set as one weight version (``forge.model.adapter_bundle``)."""
        return encode_bundle({adapter.name: (adapter.version, adapter.tensors) for adapter in self._by_path.values()})


__all__ = ["AdapterSet", "PublishedAdapter", "VersionClock", "adapter_name"]
