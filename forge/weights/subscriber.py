"""The actor's side: ``WeightSubscriber`` follows a publisher and hands over each new version, verified.

One background thread owns a SUB socket (announcements) and a DEALER socket (manifest and chunk requests, at most
``window`` chunks in flight). Chunks are received straight into one preallocated buffer per version and hashed on
a small thread pool while the next ones arrive. A version reaches ``on_version`` only when every chunk hash and the
whole-version hash match; otherwise it is dropped and the previous version stays in effect. A fetch that stalls for
``request_timeout_s`` reconnects and asks for the manifest again, so a restarted publisher is picked up. Each
verified version is also handed, as its manifest and receive buffer, to ``on_verified`` (a relay re-serves it from
there: ``forge.weights.relay``). With ``curve`` keys both sockets are CURVE clients that only complete a handshake
with the publisher holding the expected server key; failed handshakes are counted and logged
(``forge.weights.handshakes``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch
import zmq

from forge.v1 import weights_pb2 as pb
from forge.weights import endpoints
from forge.weights.assembly import Assembly
from forge.weights.buffers import BufferPool
from forge.weights.curve import ClientKeys, secure_client
from forge.weights.handshakes import HandshakeWatch
from forge.weights.manifest import Manifest, ManifestError
from forge.weights.publisher import TOPIC

log = logging.getLogger(__name__)

OnVersion = Callable[[int, dict[str, torch.Tensor]], None]
OnVerified = Callable[[Manifest, torch.Tensor], None]
_TICK_MS = 50
_DRAIN = 256
_Message = TypeVar("_Message")


def _ready_now(receive: Callable[[int], _Message]) -> Iterator[_Message]:
    """What ``receive`` has ready now, ``_DRAIN`` messages at most, without waiting: one pass reads a bounded amount,
    so the subscriber's other socket gets its turn."""
    for _ in range(_DRAIN):
        try:
            yield receive(zmq.NOBLOCK)
        except zmq.Again:
            return


@dataclass(frozen=True)
class SubscriberStats:
    latest_version: int | None = None
    bytes_received: int = 0
    chunks_received: int = 0
    versions_applied: int = 0
    versions_rejected: int = 0       # a chunk failed its hash (or length) check
    versions_abandoned: int = 0      # replaced by a newer version, or no longer served, before completion
    buffers_allocated: int = 0       # fresh receive buffers (at most one per version)
    buffers_recycled: int = 0        # buffers reused after every tensor of their version was released
    max_inflight: int = 0            # most chunk requests ever outstanding at once
    reconnects: int = 0              # fetch socket re-created after request_timeout_s without an answer
    callback_errors: int = 0
    last_transfer_s: float = 0.0     # manifest accepted -> version verified
    last_transfer_gbps: float = 0.0
    handshakes_failed: int = 0       # connections the publisher refused or could not be verified (CURVE keys)
    handshake_error: str = ""        # why the last one failed


class WeightSubscriber:
    """Receives weight versions from a ``WeightPublisher`` in a background thread.

    ``on_version(version, tensors)`` runs on that thread after full verification; keep it short (hand the tensors
    to the engine, which swaps them in between steps). The tensors are views of one buffer per version, which the
    subscriber also keeps for ``latest()`` until the next version is applied. ``on_verified(manifest, buffer)``
    runs on the same thread just before ``on_version``, with the version's manifest as received (the original
    publisher's) and its whole receive buffer (uint8, ``manifest.total_bytes``): a ``WeightRelay.serve`` re-serves
    it. Neither callback may modify the tensors or the buffer (a relay would serve the changed bytes, which its
    subscribers would reject). ``curve``: this subscriber's key pair and the publisher's public key; without it the
    channel is plain (and a CURVE publisher refuses it)."""

    def __init__(self, fetch_endpoint: str = endpoints.DEFAULT_FETCH_ENDPOINT,
                 announce_endpoint: str = endpoints.DEFAULT_ANNOUNCE_ENDPOINT, on_version: OnVersion | None = None,
                 *, window: int = 8, poll_interval_s: float = 1.0, request_timeout_s: float = 5.0,
                 verify_workers: int | None = None, pin_memory: bool = False, max_version_bytes: int | None = None,
                 curve: ClientKeys | None = None, on_verified: OnVerified | None = None,
                 context: zmq.Context | None = None) -> None:
        self.fetch_endpoint = endpoints.check_endpoint(fetch_endpoint, "fetch")
        self.announce_endpoint = endpoints.check_endpoint(announce_endpoint, "announce")
        if on_version is not None and not callable(on_version):
            raise TypeError("on_version must be callable")
        if on_verified is not None and not callable(on_verified):
            raise TypeError("on_verified must be callable")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        if poll_interval_s <= 0 or request_timeout_s <= 0:
            raise ValueError("poll_interval_s and request_timeout_s must be positive")
        self.on_version = on_version
        self.on_verified = on_verified
        self.window = window
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.max_version_bytes = max_version_bytes
        self.curve = curve
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        if curve is not None:
            secure_client(self._sub, curve)
        self._handshakes = HandshakeWatch("weight subscriber", (self._sub,))
        try:
            endpoints.connect(self._sub, self.announce_endpoint, "announce")
        except Exception:
            self._handshakes.close()
            self._sub.close()
            raise
        self._dealer: zmq.Socket | None = None
        self._verifier = ThreadPoolExecutor(verify_workers or min(4, os.cpu_count() or 1), "forge-weights-verify")
        self._assembly: Assembly | None = None
        self._buffers = BufferPool(self.pin_memory)
        self._latest: tuple[int, dict[str, torch.Tensor]] | None = None
        self._latest_verified: tuple[Manifest, torch.Tensor] | None = None
        self._rejected: tuple[int, bytes] | None = None
        self._stale = 0
        self._manifest_pending = False
        self._manifest_again = False
        self._last_answer = time.monotonic()
        self._unanswered = 0
        self._next_poll = 0.0
        self._counts = dict.fromkeys(("bytes", "chunks", "applied", "rejected", "abandoned", "max_inflight",
                                      "reconnects", "callback_errors"), 0)
        self._last_transfer_s = 0.0
        self._last_gbps = 0.0
        self._applied_cv = threading.Condition()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="forge-weights-subscriber", daemon=True)
        self._thread.start()

    @property
    def latest_version(self) -> int | None:
        latest = self._latest
        return latest[0] if latest else None

    def latest(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The last applied (version, tensors), or None before the first one."""
        return self._latest

    @property
    def latest_manifest(self) -> Manifest | None:
        """The manifest of the last applied version (as its publisher sent it), or None before the first one."""
        verified = self._latest_verified
        return verified[0] if verified else None

    def latest_verified(self) -> tuple[Manifest, torch.Tensor] | None:
        """The last applied version's manifest and whole receive buffer (do not modify it), or None before the
        first one; what ``on_verified`` was given."""
        return self._latest_verified

    @property
    def stats(self) -> SubscriberStats:
        c = dict(self._counts)
        return SubscriberStats(self.latest_version, c["bytes"], c["chunks"], c["applied"], c["rejected"],
                               c["abandoned"], self._buffers.allocated, self._buffers.recycled, c["max_inflight"],
                               c["reconnects"], c["callback_errors"], self._last_transfer_s, self._last_gbps,
                               self._handshakes.failures, self._handshakes.last_error)

    def wait_for_version(self, version: int, timeout: float | None = None) -> bool:
        """Block until a version >= ``version`` has been applied (and its callback returned); false on timeout."""
        def reached() -> bool:
            latest = self.latest_version
            return latest is not None and latest >= version

        with self._applied_cv:
            self._applied_cv.wait_for(lambda: reached() or self._closing.is_set(), timeout)
        return reached()

    def close(self) -> None:
        """Stop the background thread and release the sockets (from ``on_version`` too: then it stops after it)."""
        if self._closing.is_set():
            return
        self._closing.set()
        with self._applied_cv:
            self._applied_cv.notify_all()
        if threading.current_thread() is self._thread:
            return
        self._thread.join()

    def __enter__(self) -> WeightSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the background thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        self._poller = zmq.Poller()
        self._poller.register(self._sub, zmq.POLLIN)
        self._handshakes.register(self._poller)
        try:
            self._connect_fetch()
            self._ask_manifest()
            while not self._closing.is_set():
                self._tick()
        except Exception:
            log.exception("weight subscriber stopped on an unexpected error")
            self._closing.set()
            with self._applied_cv:
                self._applied_cv.notify_all()
        finally:
            if self._assembly:
                self._assembly.cancel()
            self._handshakes.close()
            for sock in (self._sub, self._dealer):
                if sock is not None:
                    sock.close(linger=0)
            self._verifier.shutdown(cancel_futures=True)
            self._buffers.clear()
            if self._own_context:
                self._context.term()

    def _tick(self) -> None:
        assembly = self._assembly
        if assembly is not None and assembly.failed_chunk is not None:
            self._reject(assembly)
        now = time.monotonic()
        if (self._outstanding() or self._manifest_pending) and now - self._last_answer > self.request_timeout_s:
            self._reconnect()
        idle = self._assembly is None or self._assembly.paused
        if idle and not self._manifest_pending and now >= self._next_poll:
            self._ask_manifest()
        self._pump()
        events = dict(self._poller.poll(_TICK_MS))
        if self._sub in events:
            self._read_announcements()
        if self._dealer in events:
            self._read_replies()
        self._handshakes.read(events)

    def _connect_fetch(self) -> None:
        if self._dealer is not None:
            self._poller.unregister(self._dealer)
            self._handshakes.unwatch(self._dealer, self._poller)
            self._dealer.close(linger=0)
        self._dealer = self._context.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            secure_client(self._dealer, self.curve)
        self._handshakes.watch(self._dealer, self._poller)
        endpoints.connect(self._dealer, self.fetch_endpoint, "fetch")
        self._poller.register(self._dealer, zmq.POLLIN)
        self._stale = 0
        self._manifest_pending = False

    def _reconnect(self) -> None:
        self._unanswered += 1
        log.log(logging.WARNING if self._unanswered == 1 else logging.DEBUG,
                "no answer from the weight publisher at %s for %.1f s; reconnecting", self.fetch_endpoint,
                self.request_timeout_s)
        self._counts["reconnects"] += 1
        self._connect_fetch()
        if self._assembly is not None:
            self._assembly.requeue_inflight()
            self._assembly.paused = True   # resumed only if the publisher still serves this exact version
        self._ask_manifest()

    def _outstanding(self) -> int:
        return self._stale + (len(self._assembly.inflight) if self._assembly else 0)

    def _send(self, request: pb.WeightRequest) -> bool:
        if not self._outstanding() and not self._manifest_pending:
            self._last_answer = time.monotonic()   # the timeout runs from the first outstanding request
        try:
            self._dealer.send(request.SerializeToString(), zmq.NOBLOCK)
        except zmq.Again:   # queue full: retried on a later tick
            return False
        return True

    def _ask_manifest(self) -> None:
        if self._manifest_pending:
            self._manifest_again = True
            return
        self._next_poll = time.monotonic() + self.poll_interval_s
        self._manifest_pending = self._send(pb.WeightRequest(manifest=pb.WeightManifestRequest()))

    def _pump(self) -> None:
        assembly = self._assembly
        while assembly is not None and self._outstanding() < self.window:
            index = assembly.take()
            if index is None:
                break
            if not self._send(pb.WeightRequest(chunk=pb.WeightChunkRequest(version=assembly.version, index=index))):
                assembly.give_back(index)
                break
            self._counts["max_inflight"] = max(self._counts["max_inflight"], self._outstanding())

    def _read_announcements(self) -> None:
        for frames in _ready_now(self._sub.recv_multipart):
            announcement = pb.WeightAnnouncement()
            try:
                announcement.ParseFromString(frames[-1])
            except Exception:
                log.warning("ignoring a malformed weight announcement")
                continue
            if self._wants(announcement.version, announcement.version_hash):
                self._ask_manifest()

    def _wants(self, version: int, version_hash: bytes) -> bool:
        """Whether a version is worth fetching: newer than the applied one, not rejected, not already the target."""
        latest, assembly = self.latest_version, self._assembly
        if latest is not None and version <= latest:
            return False
        if self._rejected == (version, version_hash):
            return False
        if assembly is not None and not assembly.paused:
            same = assembly.version == version and assembly.manifest.version_hash == version_hash
            return assembly.version < version or (assembly.version == version and not same)
        return True

    def _read_replies(self) -> None:
        for head in _ready_now(self._dealer.recv):
            self._last_answer = time.monotonic()
            self._unanswered = 0
            reply = pb.WeightReply()
            try:
                reply.ParseFromString(head)
            except Exception:
                log.warning("ignoring a malformed reply from the weight publisher")
                self._discard_rest()
                continue
            body = reply.WhichOneof("body")
            if body == "chunk":
                self._on_chunk(reply)
            else:
                self._discard_rest()
                self._on_manifest_reply(reply)
            self._pump()

    def _discard_rest(self) -> None:
        while self._dealer.getsockopt(zmq.RCVMORE):
            self._dealer.recv_into(bytearray())

    def _on_manifest_reply(self, reply: pb.WeightReply) -> None:
        self._manifest_pending = False
        if self._manifest_again:
            self._manifest_again = False
            self._ask_manifest()
        if reply.status == pb.WEIGHT_STATUS_NO_VERSION:
            return
        if reply.status != pb.WEIGHT_STATUS_OK or reply.WhichOneof("body") != "manifest":
            log.warning("weight publisher refused a manifest request: %s", reply.error or reply.status)
            return
        try:
            manifest = Manifest.from_proto(reply.manifest)
        except ManifestError as exc:
            log.warning("ignoring an invalid manifest: %s", exc)
            return
        self._consider(manifest)

    def _consider(self, manifest: Manifest) -> None:
        assembly = self._assembly
        if assembly is not None:
            if assembly.version == manifest.version and assembly.manifest.version_hash == manifest.version_hash:
                assembly.paused = False
                return
            self._abandon(assembly, f"the publisher now serves version {manifest.version}")
        latest = self.latest_version
        if latest is not None and manifest.version <= latest:
            if manifest.version < latest:
                log.debug("ignoring version %d: version %d is already applied", manifest.version, latest)
            return
        if self._rejected == (manifest.version, manifest.version_hash):
            return
        if self.max_version_bytes is not None and manifest.total_bytes > self.max_version_bytes:
            log.error("refusing version %d: %d bytes exceed max_version_bytes=%d", manifest.version,
                      manifest.total_bytes, self.max_version_bytes)
            self._rejected = (manifest.version, manifest.version_hash)
            self._counts["rejected"] += 1
            return
        self._begin(manifest)

    def _begin(self, manifest: Manifest) -> None:
        self._assembly = Assembly(manifest, self._buffers.take(manifest.total_bytes), self._verifier)
        log.info("fetching weight version %d: %.1f MB in %d chunks", manifest.version, manifest.total_bytes / 1e6,
                 manifest.num_chunks)
        if self._assembly.complete:
            self._finish(self._assembly)

    def _drop(self, assembly: Assembly) -> None:
        assembly.cancel()
        self._stale += len(assembly.inflight)
        self._assembly = None

    def _abandon(self, assembly: Assembly, reason: str) -> None:
        log.info("abandoning weight version %d (%d of %d chunks received): %s", assembly.version, assembly.received,
                 assembly.manifest.num_chunks, reason)
        self._counts["abandoned"] += 1
        self._drop(assembly)

    def _reject(self, assembly: Assembly) -> None:
        log.warning("rejecting weight version %d: chunk %d failed its %s check; keeping version %s",
                    assembly.version, assembly.failed_chunk, assembly.manifest.hash_algorithm, self.latest_version)
        self._counts["rejected"] += 1
        self._rejected = (assembly.version, assembly.manifest.version_hash)
        self._drop(assembly)

    def _on_chunk(self, reply: pb.WeightReply) -> None:
        header, assembly = reply.chunk, self._assembly
        if assembly is None or header.version != assembly.version or header.index not in assembly.inflight:
            self._stale = max(0, self._stale - 1)
            self._discard_rest()
            return
        if reply.status != pb.WEIGHT_STATUS_OK:
            self._discard_rest()
            assembly.give_back(header.index)
            if reply.status == pb.WEIGHT_STATUS_BAD_REQUEST:
                self._abandon(assembly, f"the publisher refused chunk {header.index}: {reply.error}")
            else:
                assembly.paused = True
                self._ask_manifest()
            return
        self._counts["chunks"] += 1
        assembly.landed(header.index, self._receive_into(assembly.target(header.index)))
        if assembly.complete:
            self._finish(assembly)

    def _receive_into(self, target: memoryview) -> bool:
        """Receive the remaining frames of a chunk reply into ``target``; true when they fill it exactly."""
        position, fits = 0, True
        while self._dealer.getsockopt(zmq.RCVMORE):
            room = target[position:] if fits and position < len(target) else bytearray()
            size = self._dealer.recv_into(room)
            self._counts["bytes"] += size
            fits = fits and size <= len(room)
            position += size
        return fits and position == len(target)

    def _finish(self, assembly: Assembly) -> None:
        if not assembly.verified():
            self._reject(assembly)
            return
        self._assembly = None
        elapsed = time.perf_counter() - assembly.started
        version, tensors = assembly.version, assembly.tensors()
        self._last_transfer_s = elapsed
        self._last_gbps = assembly.manifest.total_bytes / elapsed / 1e9 if elapsed > 0 else 0.0
        log.info("applied weight version %d: %.1f MB in %.3f s (%.2f GB/s)", version,
                 assembly.manifest.total_bytes / 1e6, elapsed, self._last_gbps)
        if self.on_verified is not None:
            try:
                self.on_verified(assembly.manifest, assembly.buffer)
            except Exception:
                self._counts["callback_errors"] += 1
                log.exception("the on_verified callback failed for weight version %d", version)
        if self.on_version is not None:
            try:
                self.on_version(version, tensors)
            except Exception:
                self._counts["callback_errors"] += 1
                log.exception("the on_version callback failed for weight version %d", version)
        self._counts["applied"] += 1
        with self._applied_cv:
            self._latest = (version, tensors)
            self._latest_verified = (assembly.manifest, assembly.buffer)
            self._applied_cv.notify_all()
