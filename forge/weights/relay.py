"""Relays: an actor re-serves the weight versions it has received and verified to other actors, so that a version
reaches N actors through a tree instead of N full sends from the learner.

``WeightRelay`` is a ``WeightPublisher`` fed with verified versions instead of state dicts: a ``WeightSubscriber``
hands each version it verified to ``WeightRelay.serve`` (its ``on_verified`` callback), which serves it from the
subscriber's own receive buffer, without a copy and without hashing again, under the ORIGINAL manifest: the same
chunking, the same chunk hashes, the same whole-version hash (and the learner's publisher id). A relay's subscribers
are plain ``WeightSubscriber``s (a relay's subscriber may relay in turn) and verify every chunk end to end against
what the learner published, so a relay that serves other bytes than it received is caught by its subscribers, who
keep their previous version. As with the learner's publisher, only the latest version is served (a chunk of any
other is answered GONE) and versions only move forward: an older or equal version handed to ``serve`` is skipped.

The served buffer stays alive while it is served (the subscriber's buffer pool recycles a buffer only once nothing
references it; the relay and any chunk still queued in ZeroMQ do), so steady state is the subscriber's two buffers,
as without a relay. Over CURVE the relay is a CURVE server like the learner's publisher: ``ServerKeys`` made of the
relaying actor's own key pair (its children name that public key as their server key) and a directory of the
public certificates of the actors it may serve."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch
import zmq

from forge.weights import endpoints
from forge.weights.curve import ServerKeys
from forge.weights.faults import Faults
from forge.weights.manifest import Manifest
from forge.weights.publisher import WeightPublisher
from forge.weights.source import received

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayStats:
    latest_version: int | None = None   # the version served (None before the first one)
    versions_relayed: int = 0           # verified versions handed to serve() and served
    versions_skipped: int = 0           # handed to serve() but not newer than the one served
    manifests_served: int = 0
    chunks_served: int = 0
    bytes_served: int = 0
    requests_refused: int = 0           # GONE, NO_VERSION or BAD_REQUEST answers
    handshakes_failed: int = 0          # CURVE: unknown client keys, or peers with the other mechanism

    @property
    def requests(self) -> int:
        """Requests answered, of every kind: the subscribers' demand on this relay."""
        return self.manifests_served + self.chunks_served + self.requests_refused


class WeightRelay:
    """Serves the versions handed to ``serve(manifest, buffer)`` to subscribers, as received.

    Endpoints are bound like a publisher's (``tcp://host:*`` resolved in ``fetch_endpoint`` and
    ``announce_endpoint``). ``curve``: serve only over CURVE, to the client keys it lists (it starts the ZAP
    authenticator of its context: give each CURVE relay a context of its own). ``faults``: as for the publisher,
    applied to the bytes this relay serves (``Faults.corrupt_chunks`` flips a byte of a chunk it sends;
    ``chunk_delay_s`` paces it like a slow link)."""

    def __init__(self, fetch_endpoint: str, announce_endpoint: str, *, announce_interval_s: float = 1.0,
                 faults: Faults | None = None, curve: ServerKeys | None = None,
                 context: zmq.Context | None = None) -> None:
        endpoints.check_endpoint(fetch_endpoint, "relay fetch")
        endpoints.check_endpoint(announce_endpoint, "relay announce")
        self._publisher = WeightPublisher(fetch_endpoint, announce_endpoint, announce_interval_s=announce_interval_s,
                                          hash_workers=1, faults=faults, curve=curve, context=context)
        self._skipped = 0
        self._lock = threading.Lock()       # one version handed over at a time, from any thread
        log.info("weight relay: serving the versions it verifies on fetch %s, announce %s%s", self.fetch_endpoint,
                 self.announce_endpoint, " (CURVE)" if curve else "")

    @property
    def fetch_endpoint(self) -> str:
        return self._publisher.fetch_endpoint

    @property
    def announce_endpoint(self) -> str:
        return self._publisher.announce_endpoint

    @property
    def curve(self) -> ServerKeys | None:
        return self._publisher.curve

    @property
    def latest_version(self) -> int | None:
        return self._publisher.latest_version

    @property
    def stats(self) -> RelayStats:
        served = self._publisher.stats
        return RelayStats(self.latest_version, served.versions_published, self._skipped, served.manifests_served,
                          served.chunks_served, served.bytes_served, served.requests_refused,
                          served.handshakes_failed)

    def figures(self) -> dict[str, float]:
        """The relay's figures as a service's gauges (``relay_*``), for Stats and ``forge top``."""
        stats = self.stats
        return {"relay_version": float(-1 if stats.latest_version is None else stats.latest_version),
                "relay_versions": float(stats.versions_relayed), "relay_requests": float(stats.requests),
                "relay_manifests_served": float(stats.manifests_served),
                "relay_chunks_served": float(stats.chunks_served), "relay_bytes_served": float(stats.bytes_served),
                "relay_requests_refused": float(stats.requests_refused),
                "relay_handshakes_failed": float(stats.handshakes_failed)}

    def serve(self, manifest: Manifest, buffer: torch.Tensor) -> bool:
        """Serve a verified version (its manifest as received, and the buffer holding its flat byte space) in place
        of the one served; false, and nothing changes, when it is not newer. Made to be a ``WeightSubscriber``'s
        ``on_verified``: the buffer must not change while it is served."""
        with self._lock:
            latest = self.latest_version
            if latest is not None and manifest.version <= latest:
                self._skipped += 1
                log.debug("relay: version %d is not newer than the served version %d; skipped", manifest.version,
                          latest)
                return False
            self._publisher.serve(received(manifest, buffer))
        log.info("relaying weight version %d (%.1f MB in %d chunks) on %s", manifest.version,
                 manifest.total_bytes / 1e6, manifest.num_chunks, self.fetch_endpoint)
        return True

    def close(self) -> None:
        self._publisher.close()

    def __enter__(self) -> WeightRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
