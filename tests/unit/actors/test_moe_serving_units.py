"""Routing records of a model with experts: the pool refuses one that does not fit its call, and they round-trip with
unknown positions. (Served by real processes: integration/test_moe_serving.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from forge import expert_routing
from forge.pool.errors import InvalidRequestError
from forge.pool.sessions import check_call
from forge.v1 import pool_pb2


def test_the_pool_refuses_a_routing_record_that_does_not_fit_its_call():
    ids = np.zeros((4, 2, 2), dtype=np.int32)
    record = pool_pb2.CallRecord(session_id="s", prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-1.0, -1.0],
                                 weight_versions=[0, 0], routed_experts=expert_routing.encode(ids, 4))
    check_call(record)
    record.completion_ids.append(6)
    record.logprobs.append(-1.0)
    record.weight_versions.append(0)
    with pytest.raises(InvalidRequestError, match="covers 4 positions; the call fed 5"):
        check_call(record)
    record.routed_experts.ids = b"\x01\x02\x03"
    with pytest.raises(InvalidRequestError, match="not a whole number of positions"):
        check_call(record)


@pytest.mark.parametrize("experts", [4, 300])
def test_routing_records_round_trip_with_unknown_positions(experts):
    rng = np.random.default_rng(experts)
    ids = rng.integers(0, experts, size=(7, 3, 2)).astype(np.int32)
    ids[:2] = -1
    message = expert_routing.encode(ids, experts)
    assert len(message.ids) == ids.size * (1 if experts < 255 else 2)
    assert (expert_routing.decode(message) == ids).all() and expert_routing.positions(message) == 7
    other = rng.integers(0, experts, size=(3, 3, 2)).astype(np.int32)
    merged = expert_routing.filled(ids, other)
    assert (merged[:2] == other[:2]).all() and (merged[2:] == ids[2:]).all()
    message.num_experts = 2
    with pytest.raises(ValueError):
        expert_routing.decode(message)
