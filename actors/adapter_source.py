"""An actor's adapter source (``forge-actor --adapter-source``): named LoRA adapters added and dropped at run time.

The source's publisher (Forge's Tinker server) sends, as each version, the whole set of adapters to serve now
(``forge.model.adapter_bundle``). ``SourceFollower`` turns each set into the backend's own calls: it unloads the
adapters the set no longer holds (first, so that their room is free), loads those that are new or whose version
changed, and leaves the others alone. The subscriber may skip versions (only the latest is served), which is
harmless: each one is a whole set.

Its Stats gauges are how the publisher knows that a set is served (``adapter_source_version``: the newest version
whose every adapter was loaded or refused, the rest dropped; a request naming one of its adapters is accepted from
then on) and how many adapters it may put in one (``adapter_source_capacity``, ``--source-adapters``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from forge.model.adapter_bundle import decode_bundle

if TYPE_CHECKING:
    import torch

    from forge.actors.backend import Backend

log = logging.getLogger("forge.actor")


class SourceFollower:
    """Applies an adapter source's versions to a backend (called on the subscriber's thread)."""

    def __init__(self, backend: Backend, capacity: int, reserved: Iterable[str] = ()) -> None:
        """``capacity``: the most adapters a version may hold; ``reserved``: names served otherwise (the actor's
        ``--adapter`` runs), which the source may not use."""
        self.backend = backend
        self.capacity = capacity
        self.reserved = frozenset(reserved)
        self.served: dict[str, int] = {}          # adapter -> the version loaded from the source
        self.applied_version = -1
        self.refused = 0
        self._lock = threading.Lock()

    def apply(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Serve the set that source version ``version`` carries; what cannot be served is logged and counted."""
        with self._lock:
            try:
                bundle = decode_bundle(state)
                if len(bundle) > self.capacity:
                    raise ValueError(f"it holds {len(bundle)} adapters; this actor serves {self.capacity} from its "
                                     "source (--source-adapters)")
            except ValueError as exc:
                log.error("adapter source version %d refused: %s", version, exc)
                self.refused += 1
                self.applied_version = version
                return
            for name in [name for name in self.served if name not in bundle]:
                self._unload(name)
            for name, (adapter_version, tensors) in bundle.items():
                if self.served.get(name, -1) > adapter_version:     # a restarted publisher: its versions count anew
                    self._unload(name)
                if self.served.get(name) != adapter_version:
                    self._load(name, adapter_version, tensors)
            self.applied_version = version
            log.info("adapter source version %d served: %d adapters", version, len(self.served))

    def _unload(self, name: str) -> None:
        del self.served[name]
        try:
            self.backend.unload_adapter(name)
        except ValueError as exc:
            log.error("adapter %s could not be dropped: %s", name, exc)

    def _load(self, name: str, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        if name in self.reserved:
            log.error("the adapter source's %s is refused: an --adapter run of that name is served here", name)
            self.refused += 1
            return
        try:
            self.backend.load_adapter(name, version, tensors)
        except ValueError as exc:
            log.error("version %d of the adapter source's %s refused: %s", version, name, exc)
            self.refused += 1
            return
        self.served[name] = version

    def figures(self) -> dict[str, float]:
        """The source's Stats gauges."""
        return {"adapter_source_version": float(self.applied_version),
                "adapter_source_capacity": float(self.capacity),
                "adapter_source_adapters": float(len(self.served)),
                "adapter_source_refused": float(self.refused)}


def follow_source(backend: Backend, fetch: str, announce: str, capacity: int, curve: Any = None,
                  reserved: Iterable[str] = ()) -> tuple[Any, SourceFollower]:
    """A ``forge.weights.WeightSubscriber`` on the source's endpoints (over CURVE with ``curve``, a
    ``forge.weights.curve.ClientKeys``) feeding a ``SourceFollower`` of ``backend``; both are returned."""
    from forge.weights import WeightSubscriber

    follower = SourceFollower(backend, capacity, reserved)
    subscriber = WeightSubscriber(fetch, announce, on_version=follower.apply, curve=curve)
    return subscriber, follower


__all__ = ["SourceFollower", "follow_source"]
