"""The learner's side: ``WeightPublisher`` serves the latest weight version to any number of subscribers.

A ROUTER socket answers manifest and chunk requests; a PUB socket announces each new version (and repeats the
announcement periodically). One background thread owns both sockets; ``publish`` prepares a version on the
caller's thread (staging, hashing) and hands it over; ``serve`` hands over a version prepared elsewhere as it is
(a relay's verified copy of another publisher's version, ``forge.weights.relay``). With ``curve`` keys both sockets
are CURVE servers and a ZAP authenticator admits only the listed subscribers (``forge.weights.curve``). Only the
latest version is served; chunks of the previous one that are already queued in ZeroMQ still leave, the rest are
answered GONE."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import zmq

from forge.v1 import weights_pb2 as pb
from forge.weights import endpoints, hashing
from forge.weights.curve import ServerKeys, secure_server, start_authenticator
from forge.weights.faults import Faults
from forge.weights.handshakes import HandshakeWatch
from forge.weights.manifest import Manifest
from forge.weights.source import ServedVersion, check_chunk_size, check_version, prepare

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 4 << 20
TOPIC = b"forge.v1.weights"
_STOP = b"stop"


@dataclass(frozen=True)
class PublisherStats:
    versions_published: int = 0
    manifests_served: int = 0
    chunks_served: int = 0
    bytes_served: int = 0
    requests_refused: int = 0     # GONE, NO_VERSION or BAD_REQUEST answers
    last_publish_s: float = 0.0   # time publish() spent staging and hashing the last version
    handshakes_failed: int = 0    # connections refused in the handshake: unknown client key, wrong server key, or
                                  # a peer with the other security mechanism (CURVE against none)


class WeightPublisher:
    """Serves weight versions; ``publish(version, state_dict)`` replaces the served version with a newer one.

    Contiguous CPU tensors are served in place: do not modify them until the next ``publish`` (or pass
    ``copy=True``). Endpoints are bound, so a ``tcp://host:*`` port is resolved in ``fetch_endpoint`` and
    ``announce_endpoint``. ``curve``: serve only over CURVE, to the client keys it lists; the publisher then
    starts the ZAP authenticator of its context, so give each CURVE publisher a context of its own."""

    def __init__(self, fetch_endpoint: str = endpoints.DEFAULT_FETCH_ENDPOINT,
                 announce_endpoint: str = endpoints.DEFAULT_ANNOUNCE_ENDPOINT, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, hash_algorithm: str = hashing.DEFAULT_ALGORITHM,
                 announce_interval_s: float = 1.0, hash_workers: int | None = None, pin_memory: bool = False,
                 faults: Faults | None = None, curve: ServerKeys | None = None,
                 context: zmq.Context | None = None) -> None:
        self.chunk_size = check_chunk_size(chunk_size)
        self.hash_algorithm = hashing.check_algorithm(hash_algorithm)
        endpoints.check_endpoint(fetch_endpoint, "fetch")
        endpoints.check_endpoint(announce_endpoint, "announce")
        if announce_interval_s <= 0:
            raise ValueError(f"announce_interval_s must be positive, got {announce_interval_s}")
        self.announce_interval_s = announce_interval_s
        self.pin_memory = pin_memory
        self.faults = faults or Faults()
        self.publisher_id = uuid.uuid4().hex[:12]
        self.curve = curve
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._authenticator = None
        if curve is not None:
            try:
                self._authenticator = start_authenticator(self._context, curve)
            except Exception:
                if self._own_context:
                    self._context.term()
                raise
        self._router = self._context.socket(zmq.ROUTER)
        self._pub = self._context.socket(zmq.PUB)
        self._wake = self._context.socket(zmq.PAIR)
        self._wake_sink = self._context.socket(zmq.PAIR)
        for sock in (self._router, self._pub, self._wake, self._wake_sink):
            sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            secure_server(self._router, curve)
            secure_server(self._pub, curve)
        self._handshakes = HandshakeWatch("weight publisher", (self._router, self._pub))
        try:
            self.fetch_endpoint = endpoints.bind(self._router, fetch_endpoint, "fetch")
            self.announce_endpoint = endpoints.bind(self._pub, announce_endpoint, "announce")
        except Exception:
            self._close_sockets()
            raise
        wake_address = f"inproc://forge-weights-wake-{self.publisher_id}"
        self._wake_sink.bind(wake_address)
        self._wake.connect(wake_address)
        self._hasher = ThreadPoolExecutor(hash_workers or min(8, os.cpu_count() or 1), "forge-weights-hash")
        self._publish_lock = threading.Lock()
        self._handoff: ServedVersion | None = None
        self._swapped = threading.Event()
        self._last_version: int | None = None
        self._versions_published = 0
        self._last_publish_s = 0.0
        self._served = {"manifests": 0, "chunks": 0, "bytes": 0, "refused": 0}   # written by the serve thread only
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="forge-weights-publisher", daemon=True)
        self._thread.start()
        log.info("weight publisher %s: fetch %s, announce %s%s", self.publisher_id, self.fetch_endpoint,
                 self.announce_endpoint, f", CURVE for {len(curve.clients)} client keys" if curve else "")

    @property
    def stats(self) -> PublisherStats:
        served = dict(self._served)
        return PublisherStats(self._versions_published, served["manifests"], served["chunks"], served["bytes"],
                              served["refused"], self._last_publish_s, self._handshakes.failures)

    @property
    def latest_version(self) -> int | None:
        return self._last_version

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor], *, copy: bool = False) -> Manifest:
        """Serve ``state_dict`` (name -> tensor, CPU or GPU) as ``version``, which must exceed the last one published.

        Returns once the version is staged, hashed and served; ``copy=True`` snapshots CPU tensors too."""
        check_version(version)
        with self._publish_lock:
            self._check_next(version)
            started = time.perf_counter()
            served = prepare(version, state_dict, chunk_size=self.chunk_size, hash_algorithm=self.hash_algorithm,
                             executor=self._hasher, copy=copy, pin_memory=self.pin_memory,
                             publisher_id=self.publisher_id)
            elapsed = time.perf_counter() - started
            self._hand_over(served)
            self._last_publish_s = elapsed
        manifest = served.manifest
        log.info("published version %d: %d tensors, %.1f MB in %d chunks (prepared in %.3f s)", version,
                 len(manifest.tensors), manifest.total_bytes / 1e6, manifest.num_chunks, elapsed)
        return manifest

    def serve(self, served: ServedVersion) -> Manifest:
        """Serve a version prepared elsewhere, as it is: its manifest (chunking, hashes and publisher id included)
        and its chunks' buffers, which must hold exactly the bytes the manifest's hashes were taken over (a relay's
        received and verified version, ``forge.weights.source.received``). Nothing is hashed here; a subscriber
        still verifies every chunk. The version must exceed the last one served; returns once it is served."""
        version = check_version(served.version)
        if len(served.chunks) != served.manifest.num_chunks:
            raise ValueError(f"version {version}: {len(served.chunks)} chunks for a manifest of "
                             f"{served.manifest.num_chunks}")
        with self._publish_lock:
            self._check_next(version)
            self._hand_over(served)
        log.debug("serving version %d as prepared: %.1f MB in %d chunks", version, served.manifest.total_bytes / 1e6,
                  served.manifest.num_chunks)
        return served.manifest

    def _check_next(self, version: int) -> None:
        """Refuse ``version`` unless it may be served next (under the publish lock)."""
        if self._closed:
            raise RuntimeError("the weight publisher is closed")
        if self._last_version is not None and version <= self._last_version:
            raise ValueError(f"version {version} is not greater than the last published version "
                             f"{self._last_version}")

    def _hand_over(self, served: ServedVersion) -> None:
        """Make ``served`` the version the serving thread serves; returns once it is swapped in (publish lock)."""
        self._swapped.clear()
        self._handoff = served
        self._wake.send(b"")
        while not self._swapped.wait(0.1):
            if not self._thread.is_alive():
                raise RuntimeError("the weight publisher's serving thread has stopped")
        self._last_version = served.version
        self._versions_published += 1

    def close(self) -> None:
        with self._publish_lock:
            if self._closed:
                return
            self._closed = True
            self._wake.send(_STOP)
        self._thread.join()
        self._hasher.shutdown()
        self._close_sockets()
        log.info("weight publisher %s closed", self.publisher_id)

    def __enter__(self) -> WeightPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_sockets(self) -> None:
        self._handshakes.close()
        for sock in (self._router, self._pub, self._wake, self._wake_sink):
            sock.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._own_context:
            self._context.term()

    def _serve(self) -> None:
        try:
            self._serve_forever()
        except Exception:
            log.exception("weight publisher %s stopped serving on an unexpected error", self.publisher_id)

    def _serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_sink, zmq.POLLIN)
        self._handshakes.register(poller)
        current: ServedVersion | None = None
        next_announce = float("inf")
        while True:
            timeout_ms = max(0, int((next_announce - time.monotonic()) * 1000)) if current else None
            events = dict(poller.poll(timeout_ms))
            if self._wake_sink in events:
                if self._wake_sink.recv() == _STOP:
                    return
                current, self._handoff = self._handoff, None
                self._swapped.set()
                next_announce = 0.0
            self._handshakes.read(events)
            if self._router in events:
                for _ in range(64):
                    if self._handoff is not None:
                        break   # a new version waits: swap it in first
                    try:
                        frames = self._router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._answer(frames, current)
                    except Exception:
                        log.exception("weight publisher: failed to answer a request")
            if current and time.monotonic() >= next_announce:
                self._announce(current)
                next_announce = time.monotonic() + self.announce_interval_s

    def _announce(self, served: ServedVersion) -> None:
        manifest = served.manifest
        message = pb.WeightAnnouncement(version=manifest.version, version_hash=manifest.version_hash,
                                        total_bytes=manifest.total_bytes, publisher_id=self.publisher_id)
        self._pub.send_multipart([TOPIC, message.SerializeToString()])

    def _answer(self, frames: list[bytes], current: ServedVersion | None) -> None:
        identity = frames[0]
        request = pb.WeightRequest()
        try:
            if len(frames) != 2:
                raise ValueError(f"expected one request frame, got {len(frames) - 1}")
            request.ParseFromString(frames[1])
        except Exception as exc:
            self._refuse(identity, pb.WEIGHT_STATUS_BAD_REQUEST, current, error=f"malformed request: {exc}")
            return
        kind = request.WhichOneof("kind")
        if kind == "manifest":
            if current is None:
                self._refuse(identity, pb.WEIGHT_STATUS_NO_VERSION, current)
            else:
                self._served["manifests"] += 1        # counted first: whoever holds the answer sees it counted
                self._router.send_multipart([identity, current.manifest_reply])
        elif kind == "chunk":
            self._serve_chunk(identity, request.chunk, current)
        else:
            self._refuse(identity, pb.WEIGHT_STATUS_BAD_REQUEST, current, error="empty request")

    def _serve_chunk(self, identity: bytes, ask: pb.WeightChunkRequest, current: ServedVersion | None) -> None:
        if current is None or ask.version != current.version:
            status = pb.WEIGHT_STATUS_NO_VERSION if current is None else pb.WEIGHT_STATUS_GONE
            self._refuse(identity, status, current, chunk=pb.WeightChunkHeader(version=ask.version, index=ask.index))
            return
        if ask.index >= len(current.chunks):
            self._refuse(identity, pb.WEIGHT_STATUS_BAD_REQUEST, current, error=f"no chunk {ask.index}",
                         chunk=pb.WeightChunkHeader(version=ask.version, index=ask.index))
            return
        start, end = current.manifest.chunk_range(ask.index)
        header = pb.WeightReply(status=pb.WEIGHT_STATUS_OK, latest_version=current.version,
                                chunk=pb.WeightChunkHeader(version=ask.version, index=ask.index, nbytes=end - start))
        parts = self.faults.on_wire(ask.version, ask.index, current.chunks[ask.index])
        if self.faults.chunk_delay_s:
            time.sleep(self.faults.chunk_delay_s)
        self._served["chunks"] += 1
        self._served["bytes"] += end - start
        self._router.send_multipart([identity, header.SerializeToString(), *parts], copy=False)

    def _refuse(self, identity: bytes, status: int, current: ServedVersion | None, error: str = "",
                chunk: pb.WeightChunkHeader | None = None) -> None:
        reply = pb.WeightReply(status=status, error=error, chunk=chunk)
        if current is not None:
            reply.latest_version = current.version
        self._served["refused"] += 1
        self._router.send_multipart([identity, reply.SerializeToString()])
