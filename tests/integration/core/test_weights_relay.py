"""forge-actor processes relay the learner's versions to each other (from an engine process and from a server
process), bit for bit, and over CURVE to their listed actors only. (Relays in one process:
unit/test_weights_relay.py.)"""

from __future__ import annotations

import shutil

import grpc
import torch

from forge.checkpoints import tiny_model
from forge.model.generate import generate
from forge.sampling.params import SamplingParams
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from forge.weights import WeightPublisher, WeightSubscriber
from forge.weights.curve import client_keys, create_keys, server_keys

from helpers.processes import start_actor
from helpers.waiting import WAIT_S, wait_for
from helpers.weights import FAST, STEADY, Received, assert_state_equal


def wait_for_gauge(stub: actor_pb2_grpc.ActorStub, name: str, value: float) -> dict[str, float]:
    """The actor's gauges once its ``name`` is ``value``."""
    def reached() -> dict[str, float] | None:
        gauges = dict(stub.Stats(common_pb2.StatsRequest()).gauges)
        return gauges if gauges.get(name) == value else None

    return wait_for(reached, f"the actor's {name} to be {value}")


def test_forge_actor_processes_relay_the_learners_versions(tmp_path):
    """learner (here) -> actor A (relaying from its engine process) -> actor B (relaying from its server process,
    --in-process) -> a subscriber here: every one applies the new version, bit for bit."""
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    publisher.publish(4, tiny_model(seed=3).state_dict())
    relaying = ["--relay-fetch", "tcp://127.0.0.1:*", "--relay-announce", "tcp://127.0.0.1:*"]
    actors = []
    try:
        first = start_actor(tmp_path, "--weights-fetch", publisher.fetch_endpoint, "--weights-announce",
                            publisher.announce_endpoint, *relaying, name="actor-a")
        actors.append(first)
        assert first.info["relay_fetch"].startswith("tcp://127.0.0.1:") and "*" not in first.info["relay_fetch"]
        second = start_actor(tmp_path, "--weights-fetch", first.info["relay_fetch"], "--weights-announce",
                             first.info["relay_announce"], "--in-process", *relaying, name="actor-b")
        actors.append(second)
        leaf_received = Received()
        with WeightSubscriber(second.info["relay_fetch"], second.info["relay_announce"], leaf_received,
                              **STEADY) as leaf, \
                grpc.insecure_channel(first.address) as one, grpc.insecure_channel(second.address) as two:
            stubs = actor_pb2_grpc.ActorStub(one), actor_pb2_grpc.ActorStub(two)
            assert leaf.wait_for_version(4, WAIT_S)
            new = tiny_model(seed=7)
            with torch.no_grad():
                for p in new.parameters():
                    p.mul_(1.5)
            publisher.publish(5, new.state_dict())
            gauges = [wait_for_gauge(stub, "weight_version", 5) for stub in stubs]
            assert leaf.wait_for_version(5, WAIT_S)
            assert_state_equal(leaf_received.states[5], {k: v.detach() for k, v in new.state_dict().items()})
            for stub in stubs:         # served to the next level: the relay figures say so
                relay_gauges = wait_for_gauge(stub, "relay_version", 5)
                assert relay_gauges["relay_chunks_served"] > 0 and relay_gauges["relay_requests"] > 0
            assert all(g["weight_version"] == 5 for g in gauges)
            greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
            request = actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3], sampling=common_pb2.SamplingParams(
                temperature=0, max_tokens=6, ignore_eos=True))
            chunks = list(stubs[1].Generate(request))
            assert {v for c in chunks for v in c.weight_versions} == {5}
            assert [t for c in chunks for t in c.token_ids] == generate(new, [1, 2, 3], greedy).token_ids
    finally:
        for actor in reversed(actors):
            assert actor.stop() == 0
        publisher.close()


def test_a_forge_actor_process_relays_over_curve_to_its_listed_actors_only(tmp_path):
    keys = create_keys(tmp_path / "keys", ["actor-0", "actor-1"])
    listed = tmp_path / "relay-clients"                   # actor-0 relays to actor-1 only
    listed.mkdir()
    shutil.copy(keys.clients_dir / "actor-1.key", listed / "actor-1.key")
    relay_public = keys.clients_dir / "actor-0.key"      # actor-0's public certificate is its relay's server key
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                                curve=server_keys(keys.server_secret, keys.clients_dir))
    sent = tiny_model(seed=5).state_dict()
    publisher.publish(2, sent)
    actor = None
    try:
        actor = start_actor(tmp_path, "--weights-fetch", publisher.fetch_endpoint, "--weights-announce",
                            publisher.announce_endpoint, "--weights-key", str(keys.client_secrets["actor-0"]),
                            "--weights-server-key", str(keys.server_public), "--relay-fetch", "tcp://127.0.0.1:*",
                            "--relay-announce", "tcp://127.0.0.1:*", "--relay-clients", str(listed))
        fetch, announce = actor.info["relay_fetch"], actor.info["relay_announce"]
        with WeightSubscriber(fetch, announce, curve=client_keys(keys.client_secrets["actor-1"], relay_public),
                              **STEADY) as child, \
                WeightSubscriber(fetch, announce, curve=client_keys(keys.client_secrets["actor-0"], relay_public),
                                 **FAST) as unlisted, \
                WeightSubscriber(fetch, announce, **FAST) as plain:
            assert child.wait_for_version(2, WAIT_S), child.stats
            assert_state_equal(child.latest()[1], {k: v.detach() for k, v in sent.items()})
            wait_for(lambda: unlisted.stats.handshakes_failed >= 1 and plain.stats.handshakes_failed >= 1,
                       "the refused handshakes")
            for refused in (unlisted, plain):
                assert refused.stats.latest_version is None and refused.stats.bytes_received == 0
            with grpc.insecure_channel(actor.address) as channel:
                gauges = wait_for_gauge(actor_pb2_grpc.ActorStub(channel), "relay_version", 2)
            assert gauges["relay_handshakes_failed"] >= 1 and gauges["relay_chunks_served"] > 0
    finally:
        if actor is not None:
            assert actor.stop() == 0
        publisher.close()
