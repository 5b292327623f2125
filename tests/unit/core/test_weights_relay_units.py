"""Relays on real loopback sockets: versions re-served by subscribers reach every subscriber of a tree bit for bit
under the learner's own manifest; bytes a relay corrupts are refused downstream while the previous version stays;
a relay that dies mid-transfer and comes back lets its children resume; late joiners get the latest version; CURVE
relays admit only their listed actors; and forge-actor's relay options are checked before anything loads. (Relays
in forge-actor processes: integration/test_weights_relay.py.)"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable

import pytest
import torch
from click.testing import CliRunner

from forge.weights import Faults, Manifest, WeightPublisher, WeightRelay, WeightSubscriber
from forge.weights.curve import ClientKeys, client_keys, create_keys, server_keys
from forge.weights.source import received

from conftest import free_port
from helpers.waiting import WAIT_S, wait_for
from helpers.weights import FAST, STEADY, Received, assert_state_equal


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(64, 48, generator=g)
    bf16 = torch.randn(300, 65, generator=g).to(torch.bfloat16)
    bf16[0, 0] = float("nan")
    return {"embed.weight": bf16, "layer.0.fp32": base, "layer.0.fp16": torch.randn(5, 3, 7, generator=g).half(),
            "ids": torch.randint(-10**12, 10**12, (700,), generator=g), "mask": torch.rand(9, generator=g) > 0.5,
            "transposed": base.t(), "empty": torch.empty(0, 4), "step": torch.tensor(seed)}


class Node:
    """A simulated actor: a subscriber of ``parent`` (a publisher or a relay), relaying what it verifies when
    ``relay`` (``tamper(manifest, buffer)`` runs first: a relay that changes the bytes it then serves)."""

    def __init__(self, parent: WeightPublisher | WeightRelay | Node, relay: bool = False, *,
                 faults: Faults | None = None, endpoints: tuple[str, str] | None = None,
                 curve: ClientKeys | None = None, tamper: Callable[[Manifest, torch.Tensor], None] | None = None,
                 **options: float) -> None:
        source = parent.relay if isinstance(parent, Node) else parent
        assert source is not None
        self.received = Received()
        fetch, announce = endpoints or ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        self.relay = WeightRelay(fetch, announce, faults=faults) if relay else None

        def verified(manifest: Manifest, buffer: torch.Tensor) -> None:
            if tamper is not None:
                tamper(manifest, buffer)
            if self.relay is not None:
                self.relay.serve(manifest, buffer)

        self.subscriber = WeightSubscriber(source.fetch_endpoint, source.announce_endpoint, self.received,
                                           curve=curve, on_verified=verified, **(options or STEADY))

    def close(self) -> None:
        self.subscriber.close()
        if self.relay is not None:
            self.relay.close()


def close_all(*closables) -> None:
    for item in reversed(closables):
        item.close()


def test_a_relay_tree_delivers_every_version_bit_for_bit_with_the_learners_manifest():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=4099)   # chunks span tensors
    top = Node(publisher, relay=True)
    middle = Node(top, relay=True)                         # a second level
    leaves = [Node(top), Node(top), Node(middle), Node(middle), Node(middle)]
    nodes = [top, middle, *leaves]
    try:
        manifests: dict[int, Manifest] = {}
        for version in (1, 2, 3):
            manifests[version] = publisher.publish(version, state(version))
            for node in nodes:
                assert node.subscriber.wait_for_version(version, WAIT_S), node.subscriber.stats
        for node in nodes:
            assert node.received.versions == [1, 2, 3]
            for version in (1, 2, 3):
                assert_state_equal(node.received.states[version], state(version))
            assert node.subscriber.latest_manifest == manifests[3]       # hashes and publisher id included
            assert node.subscriber.stats.versions_rejected == 0
        total = sum(m.total_bytes for m in manifests.values())
        # The learner sent each version once (to the top relay); the relays served the rest of the tree.
        assert publisher.stats.bytes_served == total
        assert top.relay.stats.bytes_served == 3 * total and middle.relay.stats.bytes_served == 3 * total
        assert top.relay.stats.versions_relayed == 3 and top.relay.latest_version == 3
        figures = top.relay.figures()
        assert figures["relay_version"] == 3 and figures["relay_bytes_served"] == 3 * total
        assert figures["relay_requests"] >= figures["relay_chunks_served"] > 0
    finally:
        close_all(publisher, *nodes)


def flip_a_byte_of(version: int) -> Callable[[Manifest, torch.Tensor], None]:
    """Writes into the verified buffer of ``version`` (a bad consumer, a memory error) before it is relayed."""

    def tamper(manifest: Manifest, buffer: torch.Tensor) -> None:
        if manifest.version == version:
            buffer[manifest.total_bytes // 2] ^= 0xFF

    return tamper


@pytest.mark.parametrize("fault", ["on the wire", "in the buffer"])
def test_what_a_relay_corrupts_is_rejected_by_its_children_who_keep_their_version(fault):
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=1024)
    if fault == "on the wire":
        relay_node = Node(publisher, relay=True, faults=Faults(corrupt_chunks=frozenset({(2, 1)})))
    else:
        relay_node = Node(publisher, relay=True, tamper=flip_a_byte_of(2))
    child = Node(relay_node, relay=True)           # what a child rejects it never relays
    grandchild = Node(child)
    nodes = [relay_node, child, grandchild]
    try:
        publisher.publish(1, state(1))
        assert grandchild.subscriber.wait_for_version(1, WAIT_S)
        publisher.publish(2, state(2))
        assert relay_node.subscriber.wait_for_version(2, WAIT_S)   # the relay itself verified version 2
        wait_for(lambda: child.subscriber.stats.versions_rejected == 1, "the child's rejection")
        assert child.subscriber.latest_version == 1 and child.received.versions == [1]
        assert_state_equal(child.subscriber.latest()[1], state(1))
        assert child.relay.latest_version == 1 and grandchild.subscriber.latest_version == 1
        publisher.publish(3, state(3))
        for node in (child, grandchild):
            assert node.subscriber.wait_for_version(3, WAIT_S), node.subscriber.stats
            assert node.received.versions == [1, 3]
            assert_state_equal(node.received.states[3], state(3))
            assert_state_equal(node.received.states[1], state(1))
        assert grandchild.subscriber.stats.versions_rejected == 0
    finally:
        close_all(publisher, *nodes)


class DiesAfter(Faults):
    """Serves ``keep`` chunks of ``version``, then answers no other chunk of it: a relay dying mid-transfer."""

    def __init__(self, version: int, keep: int) -> None:
        super().__init__()
        object.__setattr__(self, "state", {"version": version, "keep": keep, "served": 0})

    def on_wire(self, version, index, parts):
        state = self.state
        if version == state["version"]:
            if state["served"] >= state["keep"]:
                raise ConnectionAbortedError("the relay died")     # the relay answers nothing more of it
            state["served"] += 1
        return parts


def test_a_child_of_a_relay_closed_and_restarted_converges():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=16 * 1024)
    endpoints = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    relay_node = Node(publisher, relay=True, endpoints=endpoints, faults=DiesAfter(2, keep=5))
    child = Node(relay_node, window=2, **FAST)
    restarted = None
    big = {"w": torch.randn(256 * 1024, generator=torch.Generator().manual_seed(2))}      # 1 MiB, 64 chunks
    try:
        publisher.publish(1, state(1))
        assert child.subscriber.wait_for_version(1, WAIT_S)
        first_chunks = child.subscriber.stats.chunks_received
        publisher.publish(2, big)
        wait_for(lambda: child.subscriber.stats.chunks_received == first_chunks + 5, "5 chunks of version 2")
        relay_node.close()                     # it dies with the child's fetch in progress
        assert child.subscriber.latest_version == 1
        publisher.publish(3, state(3))         # published while the relay is down
        restarted = Node(publisher, relay=True, endpoints=endpoints)
        assert child.subscriber.wait_for_version(3, WAIT_S), child.subscriber.stats
        assert child.received.versions == [1, 3]                    # the partial version 2 was never applied
        assert_state_equal(child.received.states[3], state(3))
        stats = child.subscriber.stats
        assert stats.reconnects >= 1 and stats.versions_rejected == 0 and stats.versions_abandoned == 1
    finally:
        close_all(publisher, child, *([restarted] if restarted else []))


def test_a_child_resumes_a_partial_version_from_a_restarted_relay():
    """The restarted relay serves the same version under the same manifest (the learner's): the child keeps the
    chunks it has and fetches only the rest."""
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=16 * 1024)
    endpoints = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    relay_node = Node(publisher, relay=True, endpoints=endpoints, faults=DiesAfter(2, keep=5))
    child = Node(relay_node, window=2, **FAST)
    restarted = None
    big = {"w": torch.randn(256 * 1024, generator=torch.Generator().manual_seed(2))}
    try:
        publisher.publish(1, state(1))
        assert child.subscriber.wait_for_version(1, WAIT_S)
        first_chunks = child.subscriber.stats.chunks_received
        two = publisher.publish(2, big)
        wait_for(lambda: child.subscriber.stats.chunks_received == first_chunks + 5, "5 chunks of version 2")
        relay_node.close()
        restarted = Node(publisher, relay=True, endpoints=endpoints)
        assert child.subscriber.wait_for_version(2, WAIT_S), child.subscriber.stats
        assert child.received.versions == [1, 2]
        assert_state_equal(child.received.states[2], big)
        stats = child.subscriber.stats
        assert stats.reconnects >= 1 and stats.versions_abandoned == 0 and stats.versions_rejected == 0
        assert stats.chunks_received == first_chunks + two.num_chunks      # nothing fetched twice
    finally:
        close_all(publisher, child, *([restarted] if restarted else []))


def test_a_late_joiner_gets_the_latest_version_from_a_relay():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=2048)
    relay_node = Node(publisher, relay=True)
    late = None
    try:
        for version in (1, 2, 3):
            publisher.publish(version, state(version))
            assert relay_node.subscriber.wait_for_version(version, WAIT_S)
        late = Node(relay_node)
        assert late.subscriber.wait_for_version(3, WAIT_S)
        assert late.received.versions == [3]          # the relay serves its latest version only
        assert_state_equal(late.received.states[3], state(3))
        assert relay_node.relay.stats.versions_relayed == 3
    finally:
        close_all(publisher, relay_node, *([late] if late else []))


def test_a_served_buffer_is_never_recycled_while_served_and_versions_only_move_forward():
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=4096)
    source = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, **STEADY)   # no relay attached
    relay = WeightRelay("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    child = None
    try:
        publisher.publish(1, state(1))
        assert source.wait_for_version(1, WAIT_S)
        assert relay.serve(*source.latest_verified())       # from now on only the relay holds version 1's buffer
        for version in (2, 3, 4):                            # the source moves on; its pool recycles what is free
            publisher.publish(version, state(version))
            assert source.wait_for_version(version, WAIT_S)
        stats = source.stats
        assert stats.buffers_allocated == 3 and stats.buffers_recycled == 1    # version 1's buffer was not reused
        child = WeightSubscriber(relay.fetch_endpoint, relay.announce_endpoint, **STEADY)
        assert child.wait_for_version(1, WAIT_S)
        assert_state_equal(child.latest()[1], state(1))       # served intact after three newer versions
        assert child.stats.versions_rejected == 0
        manifest, buffer = source.latest_verified()
        assert manifest.version == 4 and source.latest_manifest == manifest
        assert relay.serve(manifest, buffer) and relay.latest_version == 4
        assert not relay.serve(*source.latest_verified())    # not newer: skipped
        assert relay.stats.versions_skipped == 1 and relay.stats.versions_relayed == 2
        assert child.wait_for_version(4, WAIT_S)
        assert_state_equal(child.latest()[1], state(4))
        with pytest.raises(ValueError, match="holds 10 bytes"):
            received(manifest, torch.zeros(10, dtype=torch.uint8))
    finally:
        close_all(publisher, relay, source, *([child] if child else []))


def test_a_curve_relay_serves_its_listed_actors_only(tmp_path):
    keys = create_keys(tmp_path / "keys", ["relay", "leaf", "stranger"])
    relay_public = keys.clients_dir / "relay.key"
    listed = tmp_path / "relay-clients"                   # the actors this relay serves
    listed.mkdir()
    shutil.copy(keys.clients_dir / "leaf.key", listed / "leaf.key")
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=8192,
                                curve=server_keys(keys.server_secret, keys.clients_dir))
    relay = WeightRelay("tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                        curve=server_keys(keys.client_secrets["relay"], listed))
    source = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, on_verified=relay.serve,
                              curve=client_keys(keys.client_secrets["relay"], keys.server_public), **STEADY)
    leaf_received = Received()
    leaf = WeightSubscriber(relay.fetch_endpoint, relay.announce_endpoint, leaf_received,
                            curve=client_keys(keys.client_secrets["leaf"], relay_public), **STEADY)
    stranger = WeightSubscriber(relay.fetch_endpoint, relay.announce_endpoint,
                                curve=client_keys(keys.client_secrets["stranger"], relay_public), **FAST)
    wrong_server = WeightSubscriber(relay.fetch_endpoint, relay.announce_endpoint,     # expects the learner's key
                                    curve=client_keys(keys.client_secrets["leaf"], keys.server_public), **FAST)
    plain = WeightSubscriber(relay.fetch_endpoint, relay.announce_endpoint, **FAST)
    try:
        for version in (1, 2):
            publisher.publish(version, state(version))
            assert leaf.wait_for_version(version, WAIT_S), leaf.stats
            assert_state_equal(leaf_received.states[version], state(version))
        wait_for(lambda: all(s.stats.handshakes_failed >= 1 for s in (stranger, wrong_server, plain)),
                   "the refused handshakes")
        for refused in (stranger, wrong_server, plain):
            stats = refused.stats
            assert stats.latest_version is None and stats.bytes_received == 0, stats
        assert "ZAP status 400" in stranger.stats.handshake_error
        assert "another security mechanism" in plain.stats.handshake_error
        assert leaf.stats.handshakes_failed == 0 and relay.stats.handshakes_failed >= 1
    finally:
        close_all(publisher, relay, source, leaf, stranger, wrong_server, plain)


# -- forge-actor ---------------------------------------------------------------------------------------------------


def refusal(*args: str) -> str:
    """The one error line (exit status 2) of forge-actor given ``args``: refused before anything loads."""
    from forge.actors.cli import actor

    result = CliRunner().invoke(actor, list(args))
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    return errors[0]


def test_the_relay_options_are_checked_before_anything_loads(tmp_path):
    keys = create_keys(tmp_path / "keys", ["actor-0"])
    parent = ["--weights-fetch", "tcp://127.0.0.1:5701", "--weights-announce", "tcp://127.0.0.1:5702"]
    relay = ["--relay-fetch", "tcp://127.0.0.1:*", "--relay-announce", "tcp://127.0.0.1:*"]
    curve = ["--weights-key", str(keys.client_secrets["actor-0"]), "--weights-server-key", str(keys.server_public)]
    assert "go together" in refusal(*parent, "--relay-fetch", "tcp://127.0.0.1:5711")
    assert "needs --weights-fetch" in refusal(*relay)
    assert "inproc" in refusal(*parent, "--relay-fetch", "inproc://relay", "--relay-announce", "tcp://127.0.0.1:*")
    assert "needs a host and a port" in refusal(*parent, "--relay-fetch", "tcp://127.0.0.1",
                                                "--relay-announce", "tcp://127.0.0.1:*")
    assert "two endpoints" in refusal(*parent, "--relay-fetch", "tcp://127.0.0.1:5711",
                                      "--relay-announce", "tcp://127.0.0.1:5711")
    assert "differ from the parent's" in refusal(*parent, "--relay-fetch", "tcp://127.0.0.1:5701",
                                                 "--relay-announce", "tcp://127.0.0.1:*")
    assert "give --relay-clients" in refusal(*parent, *relay, *curve)
    assert "--relay-clients needs --weights-key" in refusal(*parent, *relay, "--relay-clients",
                                                            str(keys.clients_dir))
    (tmp_path / "empty").mkdir()
    assert "holds no public certificates" in refusal(*parent, *relay, *curve, "--relay-clients",
                                                     str(tmp_path / "empty"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refusal(*parent, "--relay-fetch", f"tcp://127.0.0.1:{port}", "--relay-announce", "tcp://127.0.0.1:*")
    assert "--relay-fetch" in line and "in use" in line
