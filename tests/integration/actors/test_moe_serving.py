"""A model with experts served by real processes: every call the gateway records carries the routing the actor
computed for each position it fed, equal to a full forward pass's, also when a prefill actor and a decode actor
split the call (the prompt's routing reaches the decode actor with its KV through the L3 cache, and the gateway
completes whatever did not with the prefill actor's). (Routing records alone: unit/test_moe_serving.py.)"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from forge import expert_routing
from forge.model import CausalLM
from forge.model.moe import routing_of
from forge.v1 import actor_pb2_grpc, common_pb2

from helpers.gateway_procs import calls_of, chat_calls, disaggregated_fleet
from helpers.random_model import random_tiny_moe


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    directory = tmp_path_factory.mktemp("moe-serving")
    model = str(random_tiny_moe(directory))
    with disaggregated_fleet(directory, model, 1, "--model", model) as started:
        yield started


@pytest.mark.parametrize("gateway", ["whole", "split"])
def test_recorded_calls_carry_the_routing_of_every_fed_position(fleet, gateway):
    sessions = chat_calls(fleet[gateway], f"moe-{gateway}", 3)
    calls = calls_of(fleet["dir"] / f"pool-{gateway}", sessions)
    model = CausalLM.from_pretrained(fleet["model"]).eval()
    assert len(calls) == 6
    for call in calls:
        ids = expert_routing.decode(call.routed_experts)
        tokens = [*call.prompt_ids, *call.completion_ids]
        assert ids is not None and ids.shape == (len(tokens) - 1, len(model.config.sparse_layers), 2)
        assert (ids >= 0).all(), "a position's routing is missing"
        expected = routing_of(model, tokens[:-1])
        assert (np.sort(ids, -1) == np.sort(expected, -1)).all()
    if gateway == "split":
        with grpc.insecure_channel(fleet["decode"][0].address) as channel:
            gauges = actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest(), timeout=30).gauges
        assert gauges["l3_fetched_blocks"] > 0 and gauges["l3_fetched_routing"] == gauges["l3_fetched_blocks"]
