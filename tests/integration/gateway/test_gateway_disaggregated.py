"""A disaggregated gateway against real processes: a prefill actor and a decode actor with a ``forge-cache``
between them serve chat calls with the tokens, log-probabilities and weight versions that a gateway in front of one
``both`` actor records; with its prefill actor killed (``kill -9``), calls fall back to the decode actor and still
record the same; a decode actor killed mid-call fails that call alone, recording nothing of it; an actor given in
the wrong role stops the gateway at start."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import grpc
import httpx
import pytest

from forge.pool import PoolReader
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from helpers.gateway_procs import chat_calls, disaggregated_fleet, start_gateway
from helpers.random_model import random_tiny


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pd-gateway")
    with disaggregated_fleet(directory, str(random_tiny(directory)), 2) as started:
        yield started


def recorded(pool, sessions: list[str]) -> list[tuple]:
    with PoolReader(pool) as reader:
        calls = [c for s in sessions for c in reader.get_session(s).calls]
    return [(list(c.prompt_ids), list(c.completion_ids), list(c.weight_versions)) for c in calls], \
        [list(c.logprobs) for c in calls]


def assert_same_records(fleet, run: str, count: int) -> None:
    whole = chat_calls(fleet["whole"], f"whole-{run}", count)
    split = chat_calls(fleet["split"], f"split-{run}", count)
    expected, expected_logprobs = recorded(fleet["dir"] / "pool-whole", whole)
    got, got_logprobs = recorded(fleet["dir"] / "pool-split", split)
    assert got == expected
    for a, b in zip(got_logprobs, expected_logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def gauges(gateway) -> dict[str, float]:
    return httpx.get(f"{gateway.http}/v1/stats", timeout=30).json()["gauges"]


def test_disaggregated_calls_record_what_one_actor_records(fleet):
    assert_same_records(fleet, uuid.uuid4().hex[:6], 5)
    figures = gauges(fleet["split"])
    assert figures["prefills"] >= 10 and figures["handover_fallbacks"] == 0 and figures["prefill_actors"] == 1


def test_a_prompt_that_leaves_room_for_one_token_is_answered_by_its_prefill(fleet):
    """No max_tokens and a prompt one token short of the context: the prefill's token is the whole answer, as on
    a ``both`` actor (the decode actor would have no room to continue it)."""
    context = json.loads((Path(fleet["model"]) / "config.json").read_text())["max_position_embeddings"]
    prompt = [5 + i % 90 for i in range(context - 1)]
    answers = []
    for name in ("whole", "split"):
        with grpc.insecure_channel(fleet[name].grpc_address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            session = stub.StartSession(gateway_pb2.StartSessionRequest(task_id="full"), timeout=30).session.session_id
            sampling = common_pb2.SamplingParams(temperature=1.0, seed=11)
            chunks = list(stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session, prompt_ids=prompt,
                                                                           sampling=sampling), timeout=300))
        answers.append(([t for c in chunks for t in c.token_ids], chunks[-1].finish_reason))
    assert answers[1] == answers[0] and answers[0][1] == common_pb2.FINISH_REASON_LENGTH
    assert len(answers[0][0]) == 1


def test_a_decode_actor_killed_mid_call_fails_that_call_only_and_records_nothing_of_it(fleet):
    gateway = fleet["split"]
    by_instance = {d.info["instance"]: d for d in fleet["decode"]}
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session = stub.StartSession(gateway_pb2.StartSessionRequest(task_id="kill"), timeout=30).session.session_id
        sampling = common_pb2.SamplingParams(temperature=1.0, seed=3, max_tokens=1900, ignore_eos=True)
        stream = stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session, prompt_ids=list(range(5, 90)),
                                                                  sampling=sampling), timeout=300)
        first = next(stream)
        assert first.token_ids and first.actor in by_instance      # the prefill's token, joined to the decode's
        victim = by_instance[first.actor]
        victim.proc.send_signal(signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "mid-stream" in err.value.details()
        victim.proc.wait(timeout=60)
    with PoolReader(fleet["dir"] / "pool-split") as reader:
        assert list(reader.get_session(session).calls) == []
    fleet["decode"] = [d for d in fleet["decode"] if d is not victim]
    assert_same_records(fleet, uuid.uuid4().hex[:6], 2)       # the other decode actor serves the next calls


def test_with_its_prefill_actor_killed_the_decode_actor_serves_whole_calls(fleet):
    prefill = fleet["prefill"]
    prefill.proc.send_signal(signal.SIGKILL)
    prefill.proc.wait(timeout=60)
    before = gauges(fleet["split"])["handover_fallbacks"]
    assert_same_records(fleet, uuid.uuid4().hex[:6], 3)
    assert gauges(fleet["split"])["handover_fallbacks"] >= before + 6


def test_an_actor_in_the_wrong_role_stops_the_gateway_at_start(fleet, tmp_path):
    with pytest.raises(RuntimeError) as err:
        start_gateway(tmp_path, [fleet["decode"][0].address], tmp_path / "pool", "--prefill-actor",
                      fleet["both"].address, name="gateway-wrong")
    assert "start it with --role prefill" in str(err.value)
