"""The weight transport on real loopback sockets: bit-exact round trips, late joiners, several subscribers, corrupted
chunks on the wire, versions that only move forward, the credit window and one buffer per version. (A publisher
process killed mid-transfer: integration/test_weights.py.)"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import zmq

from forge.v1 import weights_pb2 as pb
from forge.weights import Faults, Manifest, ManifestError, WeightPublisher, WeightSubscriber
from forge.weights.source import prepare

from conftest import free_port
from helpers.waiting import wait_for
from helpers.weights import FAST, Received, assert_state_equal, endpoints, mixed_state


@contextlib.contextmanager
def running(*closables):
    try:
        yield closables
    finally:
        for item in reversed(closables):
            item.close()


def test_round_trip_of_mixed_dtypes_is_bit_exact():
    state = mixed_state()
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=4099)   # chunks span tensors
    received = Received()
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, received, **FAST)
    with running(publisher, subscriber):
        manifest = publisher.publish(7, state)
        assert manifest.num_chunks > 3
        assert subscriber.wait_for_version(7, 10)
        assert received.versions == [7]
        assert_state_equal(received.states[7], state)
        version, tensors = subscriber.latest()
        assert version == 7 and tensors is received.states[7]
        assert received.states[7]["step"].dim() == 0
        stats = subscriber.stats
        assert stats.versions_applied == 1 and stats.versions_rejected == 0 and stats.bytes_received == \
            manifest.total_bytes and stats.last_transfer_gbps > 0
        assert publisher.stats.chunks_served == manifest.num_chunks


@pytest.mark.parametrize("algorithm", ["sha256", "blake2b", "sha1"])
def test_other_hash_algorithms_over_ipc(tmp_path, algorithm):
    state = mixed_state(1)
    fetch, announce = f"ipc://{tmp_path}/fetch", f"ipc://{tmp_path}/announce"
    publisher = WeightPublisher(fetch, announce, chunk_size=1000, hash_algorithm=algorithm)
    received = Received()
    subscriber = WeightSubscriber(fetch, announce, received, **FAST)
    with running(publisher, subscriber):
        publisher.publish(1, state)
        assert subscriber.wait_for_version(1, 10)
        assert_state_equal(received.states[1], state)


def test_contiguous_cpu_tensors_are_served_without_a_copy():
    contiguous = torch.randn(1000).to(torch.bfloat16)
    strided = torch.randn(20, 20).t()
    with ThreadPoolExecutor(2) as pool:
        served = prepare(1, {"a": contiguous, "b": strided}, chunk_size=512, hash_algorithm="crc32", executor=pool)
    source = contiguous.view(torch.uint8).numpy()
    first_parts = [part for chunk in served.chunks for part in chunk][:3]
    assert all(np.shares_memory(part, source) for part in first_parts)
    strided_bytes = strided.contiguous().view(torch.uint8).numpy()
    assert not any(np.shares_memory(part, strided_bytes) for chunk in served.chunks for part in chunk)


def test_a_late_joiner_receives_the_latest_version_only():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=256)
    with publisher:
        for version in (1, 2, 3):
            publisher.publish(version, mixed_state(version))
        received = Received()
        with WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, received, **FAST) as sub:
            assert sub.wait_for_version(3, 10)
            time.sleep(0.3)
            assert received.versions == [3]
            assert_state_equal(received.states[3], mixed_state(3))
            assert sub.stats.versions_applied == 1


def test_several_subscribers_all_receive_every_version():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=1024)
    receivers = [Received() for _ in range(4)]
    subscribers = [WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, r, window=2, **FAST)
                   for r in receivers]
    with running(publisher, *subscribers):
        for version in (1, 2):
            publisher.publish(version, mixed_state(version))
            for sub in subscribers:
                assert sub.wait_for_version(version, 10)
        for received in receivers:
            assert received.versions[-1] == 2
            assert_state_equal(received.states[2], mixed_state(2))


@pytest.mark.parametrize("algorithm", ["crc32", "sha256"])
def test_a_chunk_corrupted_on_the_wire_is_rejected_and_the_old_version_kept(algorithm):
    faults = Faults(corrupt_chunks=frozenset({(2, 1)}))
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=1024, hash_algorithm=algorithm,
                                faults=faults)
    received = Received()
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, received, **FAST)
    with running(publisher, subscriber):
        publisher.publish(1, mixed_state(1))
        assert subscriber.wait_for_version(1, 10)
        publisher.publish(2, mixed_state(2))
        wait_for(lambda: subscriber.stats.versions_rejected == 1, "the corrupted version's rejection")
        time.sleep(0.3)   # announcements and polls of the rejected version keep coming: it must stay rejected
        assert subscriber.latest_version == 1 and received.versions == [1]
        assert subscriber.stats.versions_rejected == 1
        assert_state_equal(subscriber.latest()[1], mixed_state(1))
        publisher.publish(3, mixed_state(3))
        assert subscriber.wait_for_version(3, 10)
        assert received.versions == [1, 3]
        assert_state_equal(received.states[3], mixed_state(3))
        assert_state_equal(received.states[1], mixed_state(1))   # its buffer was not reused while held


def test_a_newer_version_replaces_one_being_fetched():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=16 * 1024,
                                faults=Faults(chunk_delay_s=0.005))
    received = Received()
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, received, window=2, **FAST)
    with running(publisher, subscriber):
        publisher.publish(1, {"w": torch.randn(256 * 1024)})    # 1 MiB, 64 slow chunks
        wait_for(lambda: subscriber.stats.chunks_received >= 4, "4 of version 1's 64 chunks", interval_s=0.01)
        newer = {"w": torch.randn(256 * 1024)}
        publisher.publish(2, newer)
        assert subscriber.wait_for_version(2, 20)
        assert received.versions == [2]
        assert_state_equal(received.states[2], newer)
        assert subscriber.stats.versions_abandoned == 1


def test_versions_only_move_forward():
    fetch, announce = endpoints()
    received = Received()
    with WeightSubscriber(fetch, announce, received, **FAST) as sub:
        with WeightPublisher(fetch, announce, chunk_size=512) as first:
            first.publish(5, mixed_state(5))
            assert sub.wait_for_version(5, 10)
            with pytest.raises(ValueError, match="not greater than the last published version 5"):
                first.publish(5, mixed_state(6))
            with pytest.raises(ValueError, match="not greater"):
                first.publish(4, mixed_state(6))
        with WeightPublisher(fetch, announce, chunk_size=512, announce_interval_s=0.05) as older:
            older.publish(3, mixed_state(3))   # a restarted publisher with an older version, announced repeatedly
            wait_for(lambda: older.stats.manifests_served >= 2, "the older publisher's second manifest")
            time.sleep(0.2)
            assert sub.latest_version == 5 and received.versions == [5]
            older.publish(6, mixed_state(6))
            assert sub.wait_for_version(6, 10)
            assert received.versions == [5, 6]


class FakePublisher:
    """A ROUTER that answers manifest requests for one served version and records chunk requests, answering them
    only when told to: the subscriber's credit window is then directly observable."""

    def __init__(self, served) -> None:
        self.served = served
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.router.bind(self.endpoint)
        self.pending: list[tuple[bytes, int]] = []

    def collect(self, duration: float) -> None:
        deadline = time.monotonic() + duration
        while (left := deadline - time.monotonic()) > 0:
            if not self.router.poll(int(left * 1000) + 1):
                continue
            identity, raw = self.router.recv_multipart()
            request = pb.WeightRequest.FromString(raw)
            if request.WhichOneof("kind") == "manifest":
                self.router.send_multipart([identity, self.served.manifest_reply])
            else:
                self.pending.append((identity, request.chunk.index))

    def answer(self, count: int) -> None:
        for identity, index in self.pending[:count]:
            start, end = self.served.manifest.chunk_range(index)
            header = pb.WeightReply(status=pb.WEIGHT_STATUS_OK, latest_version=self.served.version,
                                    chunk=pb.WeightChunkHeader(version=self.served.version, index=index,
                                                               nbytes=end - start))
            self.router.send_multipart([identity, header.SerializeToString(), *self.served.chunks[index]])
        del self.pending[:count]

    def close(self) -> None:
        self.router.close()
        self.context.term()


def test_the_credit_window_bounds_chunks_in_flight():
    state = {"w": torch.randn(64 * 1024)}
    with ThreadPoolExecutor(1) as pool:
        served = prepare(1, state, chunk_size=4096, hash_algorithm="crc32", executor=pool)
    fake = FakePublisher(served)
    received = Received()
    subscriber = WeightSubscriber(fake.endpoint, f"tcp://127.0.0.1:{free_port()}", received, window=3,
                                  poll_interval_s=0.1, request_timeout_s=5)
    with running(fake, subscriber):
        fake.collect(0.4)
        assert len(fake.pending) == 3
        fake.answer(1)
        fake.collect(0.2)
        assert len(fake.pending) == 3
        while len(received.versions) == 0:
            assert len(fake.pending) <= 3
            fake.answer(len(fake.pending))
            fake.collect(0.02)
        assert_state_equal(received.states[1], state)
        stats = subscriber.stats
        assert stats.max_inflight == 3 and stats.buffers_allocated == 1 and stats.chunks_received == 64


def test_after_a_silent_publisher_the_fetch_resumes_from_a_restarted_one_with_the_same_version():
    state = {"w": torch.randn(64 * 1024)}
    with ThreadPoolExecutor(1) as pool:
        served = prepare(4, state, chunk_size=4096, hash_algorithm="crc32", executor=pool)
    fake = FakePublisher(served)
    received = Received()
    with WeightSubscriber(fake.endpoint, f"tcp://127.0.0.1:{free_port()}", received, window=3, **FAST) as sub:
        fake.collect(0.3)
        fake.answer(3)
        fake.collect(0.2)
        wait_for(lambda: sub.stats.chunks_received == 3, "the three answered chunks")
        assert len(fake.pending) == 3
        fake.close()   # three requests die with it
        with WeightPublisher(fake.endpoint, "tcp://127.0.0.1:*", chunk_size=4096) as restarted:
            restarted.publish(4, state)   # same bytes and layout: same whole-version hash
            assert sub.wait_for_version(4, 10)
        stats = sub.stats
        assert stats.reconnects >= 1 and stats.versions_abandoned == 0
        assert stats.chunks_received == 64   # the three received chunks were kept, nothing was fetched twice
        assert_state_equal(received.states[4], state)


def test_one_buffer_per_version_never_reused_while_held():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=4096)
    received = Received()
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, received, **FAST)
    with running(publisher, subscriber):
        for version in (1, 2, 3):   # the callback keeps every version: each needs its own buffer
            publisher.publish(version, {"w": torch.full((5000,), float(version))})
            assert subscriber.wait_for_version(version, 10)
        assert subscriber.stats.buffers_allocated == 3
        for version in (1, 2, 3):
            assert torch.equal(received.states[version]["w"], torch.full((5000,), float(version)))
        received.states.clear()   # the consumer lets go: versions 1 and 2 can be recycled
        for version in (4, 5, 6):
            publisher.publish(version, {"w": torch.full((5000,), float(version))})
            assert subscriber.wait_for_version(version, 10)
            received.states.clear()
        stats = subscriber.stats
        assert stats.buffers_allocated == 3 and stats.buffers_recycled == 3
        assert torch.equal(subscriber.latest()[1]["w"], torch.full((5000,), 6.0))


def test_bad_inputs_get_clear_errors():
    with WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        with pytest.raises(TypeError, match=r"state_dict\['b'\] is a list"):
            publisher.publish(1, {"a": torch.zeros(2), "b": [1, 2]})
        with pytest.raises(TypeError, match="keys must be non-empty strings"):
            publisher.publish(1, {3: torch.zeros(2)})
        with pytest.raises(TypeError, match="mapping"):
            publisher.publish(1, [torch.zeros(2)])
        with pytest.raises(ValueError, match="empty"):
            publisher.publish(1, {})
        with pytest.raises(ValueError, match="dense"):
            publisher.publish(1, {"s": torch.zeros(3, 3).to_sparse()})
        with pytest.raises(TypeError, match="version must be an int"):
            publisher.publish("1", {"a": torch.zeros(2)})
        with pytest.raises(TypeError, match="version must be an int"):
            publisher.publish(True, {"a": torch.zeros(2)})
        with pytest.raises(ValueError, match="outside"):
            publisher.publish(-1, {"a": torch.zeros(2)})
        publisher.publish(1, {"a": torch.zeros(2)})   # failed attempts do not use up a version
        with pytest.raises(OSError, match="cannot bind the fetch socket"):
            WeightPublisher(publisher.fetch_endpoint, "tcp://127.0.0.1:*")
    with pytest.raises(RuntimeError, match="closed"):
        publisher.publish(2, {"a": torch.zeros(2)})
    for endpoint in ("localhost:5701", "tcp://127.0.0.1", "udp://127.0.0.1:5", "tcp://127.0.0.1:99999", "tcp://"):
        with pytest.raises(ValueError, match="bad fetch endpoint"):
            WeightPublisher(endpoint, "tcp://127.0.0.1:*")
        with pytest.raises(ValueError, match="bad fetch endpoint"):
            WeightSubscriber(endpoint, "tcp://127.0.0.1:5702")
    with pytest.raises(TypeError, match="string"):
        WeightSubscriber("tcp://127.0.0.1:5701", 5702)
    with pytest.raises(ValueError, match="chunk_size"):
        WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=0)
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", hash_algorithm="md4")
    with pytest.raises(ValueError, match="window"):
        WeightSubscriber("tcp://127.0.0.1:5701", "tcp://127.0.0.1:5702", window=0)


def test_a_tampered_manifest_fails_its_whole_version_hash():
    with ThreadPoolExecutor(1) as pool:
        served = prepare(3, mixed_state(), chunk_size=999, hash_algorithm="crc32", executor=pool)
    message = pb.WeightReply.FromString(served.manifest_reply).manifest
    assert Manifest.from_proto(message) == served.manifest
    for tamper in (lambda m: m.tensors[0].shape.__setitem__(0, 11), lambda m: setattr(m, "version", 4),
                   lambda m: m.chunk_hashes.__setitem__(2, b"\0\0\0\0"), lambda m: setattr(m.tensors[1], "name", "x")):
        copy = pb.WeightManifest()
        copy.CopyFrom(message)
        tamper(copy)
        with pytest.raises(ManifestError):
            Manifest.from_proto(copy)


def test_a_malformed_request_gets_an_answer_and_the_publisher_keeps_serving():
    with WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        publisher.publish(1, {"a": torch.zeros(2)})
        with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(publisher.fetch_endpoint)
            dealer.send(b"\xff\xff garbage")
            assert dealer.poll(5000)
            reply = pb.WeightReply.FromString(dealer.recv())
            assert reply.status == pb.WEIGHT_STATUS_BAD_REQUEST and reply.error
            dealer.send(pb.WeightRequest(chunk=pb.WeightChunkRequest(version=1, index=99)).SerializeToString())
            assert dealer.poll(5000)
            assert pb.WeightReply.FromString(dealer.recv()).status == pb.WEIGHT_STATUS_BAD_REQUEST
            dealer.send(pb.WeightRequest(chunk=pb.WeightChunkRequest(version=0, index=0)).SerializeToString())
            assert dealer.poll(5000)
            reply = pb.WeightReply.FromString(dealer.recv())
            assert reply.status == pb.WEIGHT_STATUS_GONE and reply.latest_version == 1


def test_a_failing_callback_is_logged_and_counted(caplog):
    def explode(version, tensors):
        raise RuntimeError("engine refused")

    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, explode, **FAST)
    with running(publisher, subscriber):
        publisher.publish(1, {"a": torch.zeros(2)})
        assert subscriber.wait_for_version(1, 10)
        assert subscriber.stats.callback_errors == 1
        assert "on_version callback failed" in caplog.text


@pytest.mark.gpu
def test_cuda_tensors_are_staged_and_round_trip():
    state = {name: tensor.cuda() for name, tensor in mixed_state().items()}
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=4096, pin_memory=True)
    received = Received()
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, received, pin_memory=True,
                                  **FAST)
    with running(publisher, subscriber):
        publisher.publish(1, state)
        assert subscriber.wait_for_version(1, 10)
        assert_state_equal(received.states[1], state)
        assert received.states[1]["layer.0.fp32"].is_pinned()


def test_wait_for_version_times_out_and_close_is_prompt():
    fetch, announce = endpoints()
    subscriber = WeightSubscriber(fetch, announce, **FAST)
    started = time.monotonic()
    assert not subscriber.wait_for_version(1, 0.2)
    waiter = threading.Thread(target=subscriber.wait_for_version, args=(1,))
    waiter.start()
    subscriber.close()
    waiter.join(2)
    assert not waiter.is_alive() and time.monotonic() - started < 2
