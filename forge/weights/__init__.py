"""Versioned weight transport over ZeroMQ: the learner's ``WeightPublisher`` serves the latest weight version in
hashed chunks; each actor's ``WeightSubscriber`` fetches it with a bounded window and hands it over only when every
chunk and the whole version verify; a ``WeightRelay`` re-serves the versions a subscriber verified to further
subscribers (a relay tree). The protocol is described in docs/weights.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge.lazy import lazy_exports

if TYPE_CHECKING:
    from forge.weights.endpoints import DEFAULT_ANNOUNCE_ENDPOINT, DEFAULT_FETCH_ENDPOINT
    from forge.weights.faults import Faults
    from forge.weights.hashing import ALGORITHMS, DEFAULT_ALGORITHM
    from forge.weights.manifest import Manifest, ManifestError, TensorSpec
    from forge.weights.publisher import DEFAULT_CHUNK_SIZE, PublisherStats, WeightPublisher
    from forge.weights.relay import RelayStats, WeightRelay
    from forge.weights.subscriber import SubscriberStats, WeightSubscriber

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "DEFAULT_ANNOUNCE_ENDPOINT",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_FETCH_ENDPOINT",
    "Faults",
    "Manifest",
    "ManifestError",
    "PublisherStats",
    "RelayStats",
    "SubscriberStats",
    "TensorSpec",
    "WeightPublisher",
    "WeightRelay",
    "WeightSubscriber",
]
__getattr__, __dir__ = lazy_exports(__name__, {
    "DEFAULT_ANNOUNCE_ENDPOINT": "endpoints", "DEFAULT_FETCH_ENDPOINT": "endpoints", "Faults": "faults",
    "ALGORITHMS": "hashing", "DEFAULT_ALGORITHM": "hashing", "Manifest": "manifest", "ManifestError": "manifest",
    "TensorSpec": "manifest", "DEFAULT_CHUNK_SIZE": "publisher", "PublisherStats": "publisher",
    "WeightPublisher": "publisher", "RelayStats": "relay", "WeightRelay": "relay", "SubscriberStats": "subscriber",
    "WeightSubscriber": "subscriber",
})
