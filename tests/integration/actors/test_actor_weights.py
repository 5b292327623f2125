"""Weights from the learner's publisher to a forge-actor process over ZeroMQ: it serves only once it has a version,
and follows every version published after."""

from __future__ import annotations

import grpc
import torch

from forge.checkpoints import tiny_model
from forge.model.generate import generate
from forge.sampling.params import SamplingParams
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from forge.weights import WeightPublisher

from helpers.processes import start_actor
from helpers.waiting import wait_for


def test_a_forge_actor_process_follows_the_learners_versions(tmp_path):
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    first = tiny_model(seed=3)
    publisher.publish(4, first.state_dict())        # the actor joins late: it serves only once it has a version
    actor = start_actor(tmp_path, "--weights-fetch", publisher.fetch_endpoint, "--weights-announce",
                        publisher.announce_endpoint)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    request = actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3], sampling=common_pb2.SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True))
    try:
        with grpc.insecure_channel(actor.address) as channel:
            stub = actor_pb2_grpc.ActorStub(channel)
            chunks = list(stub.Generate(request))
            assert {v for c in chunks for v in c.weight_versions} == {4}
            assert [t for c in chunks for t in c.token_ids] == generate(first, [1, 2, 3], greedy).token_ids
            new = tiny_model(seed=7)
            with torch.no_grad():
                for p in new.parameters():
                    p.mul_(1.5)
            publisher.publish(5, new.state_dict())
            wait_for(lambda: stub.Stats(common_pb2.StatsRequest()).gauges["weight_version"] == 5,
                     "the actor to apply version 5")
            chunks = list(stub.Generate(request))
        assert {v for c in chunks for v in c.weight_versions} == {5}
        assert [t for c in chunks for t in c.token_ids] == generate(new, [1, 2, 3], greedy).token_ids
    finally:
        assert actor.stop() == 0
        publisher.close()
