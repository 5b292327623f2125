"""Prefill/decode disaggregation in the torch engine, with a real ``forge-cache`` process between the two: a call
prefilled by one engine (first token, prompt blocks stored in L3) and continued by another (blocks fetched) samples
the tokens, log-probabilities and versions that one engine serving it whole samples; a continuation sampled by
another weight version is refused, retryably; malformed handovers are refused before they are queued."""

from __future__ import annotations

import functools
import random
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from forge.actors.backend import Continuation, FinishReason, GenerationRequest, InvalidRequest
from forge.actors.config import EngineConfig
from forge.model import CausalLM
from forge.sampling.params import SamplingParams
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

from helpers.engines import CONFIG, make_model
from helpers.l3_engines import BLOCK, l3_engine
from helpers.processes import start_actor
from helpers.random_model import random_tiny

ACTOR_BLOCK = EngineConfig().block_size       # forge-actor's default


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model(0)


make_engine = functools.partial(l3_engine, fetch="auto", model_id="pd-test")


def collect(stream) -> tuple[list[int], list[float], list[int], object, int]:
    """Token ids, log-probs, versions, the last chunk and the first chunk's cached prompt tokens of a stream."""
    ids, logprobs, versions, last, cached = [], [], [], None, None
    for chunk in stream:
        cached = chunk.cached_prompt_tokens if cached is None else cached
        ids += chunk.token_ids
        logprobs += chunk.logprobs
        versions += chunk.weight_versions
        last = chunk
    return ids, logprobs, versions, last, cached or 0


def cases() -> list[tuple[list[int], SamplingParams]]:
    """Prompts shorter than a block, of whole blocks and in between, several behind one shared prefix (prefix hits
    on both sides), sampled, greedy and with min_tokens."""
    rng = random.Random(3)
    shared = [rng.randrange(100) for _ in range(3 * BLOCK)]
    prompts = [[rng.randrange(100) for _ in range(n)] for n in (3, BLOCK, 2 * BLOCK + 5, 41)]
    prompts += [shared + [rng.randrange(100) for _ in range(rng.randrange(0, 12))] for _ in range(6)]
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=14, ignore_eos=True) for i in range(len(prompts))]
    params[1] = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    params[2] = SamplingParams(temperature=1.1, top_p=0.9, seed=5, max_tokens=10, min_tokens=4)
    return list(zip(prompts, params, strict=True))


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "mtp"])
def test_a_handed_over_call_samples_what_one_engine_samples(model, cache_server, speculative):
    whole = make_engine(model, speculative=speculative)
    prefill = make_engine(model, cache_server.address, speculative=speculative)
    # fetch "auto": a handover's blocks are fetched all the same
    decode = make_engine(model, cache_server.address, speculative=speculative)
    try:
        for prompt, params in cases():
            expected = collect(whole.submit(GenerationRequest("", prompt, params)))
            first = collect(prefill.submit(GenerationRequest("", prompt, params, prefill_only=True)))
            assert len(first[0]) == 1 and first[3].finish_reason is FinishReason.LENGTH and first[3].continues
            reusable = (len(prompt) - 1) // BLOCK          # full blocks before the prompt's last token
            assert first[3].handover_blocks == reusable
            given = Continuation(first[0], first[1], first[2][0])
            rest = collect(decode.submit(GenerationRequest("", prompt, params, continuation=given)))
            assert first[0] + rest[0] == expected[0], prompt
            assert first[2] + rest[2] == expected[2]
            assert first[1] + rest[1] == pytest.approx(expected[1], abs=1e-5)
            assert rest[3].finish_reason == expected[3].finish_reason
            # every reusable prompt block came from L3 or the decode engine's own prefix cache: none is recomputed
            assert rest[4] >= reusable * BLOCK
        assert prefill.stats()["l3_handovers"] == len(cases())
        assert decode.stats()["l3_fetched_blocks"] >= 3         # the shared prefix, once; the other prompts' blocks
    finally:
        for engine in (whole, prefill, decode):
            engine.close()


def test_a_prefill_whose_first_token_ends_the_call_says_nothing_follows(model, cache_server):
    """max_tokens 1, a prompt that leaves room for one token only, and a stop token end the call at its first
    token, exactly as one engine serving it whole ends it; only a call with room for more continues."""
    whole, prefill = make_engine(model), make_engine(model, cache_server.address)
    rng = random.Random(7)
    short = [rng.randrange(100) for _ in range(20)]
    filling = [rng.randrange(100) for _ in range(CONFIG.max_position_embeddings - 1)]
    calls = {"max_tokens 1": (short, SamplingParams(temperature=0.9, seed=1, max_tokens=1)),
             "context full": (filling, SamplingParams(temperature=0.9, seed=2)),
             "stop token": (short, SamplingParams(temperature=0.9, seed=3, max_tokens=8,
                                                  stop_token_ids=list(range(CONFIG.vocab_size)))),
             "room for more": (short, SamplingParams(temperature=0.9, seed=4, max_tokens=8, ignore_eos=True))}
    try:
        for name, (prompt, params) in calls.items():
            first = collect(prefill.submit(GenerationRequest("", prompt, params, prefill_only=True)))
            assert len(first[0]) == 1 and first[3].continues == (name == "room for more"), name
            expected = collect(whole.submit(GenerationRequest("", prompt, params)))
            assert first[0] == expected[0][:1], name
            if not first[3].continues:
                assert first[3].finish_reason is expected[3].finish_reason, name
    finally:
        for engine in (whole, prefill):
            engine.close()


def test_a_continuation_sampled_by_another_weight_version_is_refused_retryably(model, cache_server):
    prompt, params = cases()[3]
    prefill, decode = make_engine(model, cache_server.address), make_engine(model, cache_server.address, version=1)
    try:
        first = collect(prefill.submit(GenerationRequest("", prompt, params, prefill_only=True)))
        given = Continuation(first[0], first[1], first[2][0])
        ids, _, _, last, _ = collect(decode.submit(GenerationRequest("", prompt, params, continuation=given)))
        assert ids == [] and last.finish_reason is FinishReason.ERROR and last.retryable
        assert "weight version 0" in last.error and decode.stats()["finished"] == 1
    finally:
        prefill.close()
        decode.close()


def test_malformed_handovers_are_refused_before_they_are_queued(model, cache_server):
    without_l3, engine = make_engine(model), make_engine(model, cache_server.address)
    params = SamplingParams(temperature=0.9, seed=1, max_tokens=6)
    try:
        with pytest.raises(InvalidRequest, match="needs an L3 cache"):
            without_l3.submit(GenerationRequest("", [1, 2, 3], params, prefill_only=True))
        refused = {
            "prefill_only or a continuation": dict(prefill_only=True, continuation=Continuation([5], [-1.0], 0)),
            "one log-probability per token": dict(continuation=Continuation([5, 6], [-1.0], 0)),
            "outside the vocabulary": dict(continuation=Continuation([500], [-1.0], 0)),
            "finite and at most 0": dict(continuation=Continuation([5], [0.5], 0)),
            "the one token its prefill sampled": dict(continuation=Continuation([5, 6], [-1.0, -1.0], 0)),
            "already has 1 tokens of the request's 1": dict(continuation=Continuation([5], [-1.0], 0),
                                                            params=SamplingParams(max_tokens=1)),
            "is a stop token": dict(continuation=Continuation([100], [-1.0], 0)),
            "weight version must be 0 or more": dict(continuation=Continuation([5], [-1.0], -1)),
        }
        for message, fields in refused.items():
            with pytest.raises(InvalidRequest, match=message):
                engine.submit(GenerationRequest("", [1, 2, 3], **{"params": params, **fields}))
        assert engine.stats()["running"] == engine.stats()["waiting"] == 0
    finally:
        without_l3.close()
        engine.close()


# ------------------------------------------------------------------------------- forge-actor processes


def stream_of(stub, prompt: list[int], sampling: common_pb2.SamplingParams, **fields) -> list:
    return list(stub.Generate(actor_pb2.GenerateRequest(prompt_ids=prompt, sampling=sampling, **fields), timeout=120))


def test_prefill_and_decode_actors_serve_what_a_both_actor_serves(tmp_path, cache_server):
    """Three forge-actor processes (engine cores of their own) on one random-weight checkpoint: a prefill actor, a
    decode actor and one that does both; each refuses what its role does not serve."""
    model = str(random_tiny(tmp_path))
    both = start_actor(tmp_path, "--model", model, name="both")
    prefill = start_actor(tmp_path, "--model", model, "--role", "prefill", "--l3-cache", cache_server.address,
                          name="prefill")
    decode = start_actor(tmp_path, "--model", model, "--role", "decode", "--l3-cache", cache_server.address,
                         name="decode")
    rng = random.Random(11)
    shared = [rng.randrange(1, 500) for _ in range(40)]
    try:
        with (grpc.insecure_channel(both.address) as a, grpc.insecure_channel(prefill.address) as p,
              grpc.insecure_channel(decode.address) as d):
            whole, first_stub, rest_stub = (actor_pb2_grpc.ActorStub(c) for c in (a, p, d))
            for i in range(6):
                prompt = shared + [rng.randrange(1, 500) for _ in range(rng.randrange(1, 30))]
                sampling = common_pb2.SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True)
                expected = stream_of(whole, prompt, sampling)
                (first,) = stream_of(first_stub, prompt, sampling, prefill_only=True)
                assert len(first.token_ids) == 1 and first.handover_blocks > 0
                continuation = actor_pb2.Continuation(token_ids=first.token_ids, logprobs=first.logprobs,
                                                      weight_version=first.weight_versions[0])
                rest = stream_of(rest_stub, prompt, sampling, continuation=continuation)
                tokens = [t for c in [first, *rest] for t in c.token_ids]
                assert tokens == [t for c in expected for t in c.token_ids]
                assert [lp for c in [first, *rest] for lp in c.logprobs] == pytest.approx(
                    [lp for c in expected for lp in c.logprobs], abs=1e-5)
                assert rest[0].actor == decode.info["instance"]
                assert rest[0].cached_prompt_tokens == first.handover_blocks * ACTOR_BLOCK > 0
            sampling = common_pb2.SamplingParams(max_tokens=2)
            for stub, fields, message in ((first_stub, {}, "prefill actor"),
                                          (rest_stub, {"prefill_only": True}, "decode actor")):
                with pytest.raises(grpc.RpcError) as err:
                    stream_of(stub, [1, 2, 3], sampling, **fields)
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and message in err.value.details()
            report = first_stub.Stats(common_pb2.StatsRequest(), timeout=30)
            assert report.labels["role"] == "prefill" and report.gauges["l3_handovers"] == 6
    finally:
        for actor in (both, prefill, decode):
            actor.stop()


@pytest.mark.parametrize("command, args, message", [
    ("forge-actor", ["--role", "prefill"], "--role prefill needs --l3-cache"),
    ("forge-actor", ["--role", "decode", "--backend", "vllm"], "--role decode needs the torch backend"),
    ("forge-gateway", ["--actor", "127.0.0.1:1", "--prefill-actor", "127.0.0.1:1", "--pool", "p"],
     "given as --actor and as --prefill-actor"),
    ("forge", ["up", "--decode-actors", "2"], "--decode-actors goes with --prefill-actors"),
    ("forge", ["up", "--prefill-actors", "1", "--no-cache"], "--prefill-actors needs the torch backend and forge-cache"),
])
def test_a_role_that_cannot_work_is_refused_at_start(tmp_path, command, args, message):
    result = subprocess.run([str(Path(sys.executable).parent / command), *args], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("with_l3", [False, True], ids=["queued", "fetching"])
def test_a_weight_swap_before_a_continuation_starts_refuses_it_retryably(model, cache_server, with_l3):
    """The continuation and a new weight version reach the engine loop in one pass (the test holds the loop's
    lock while it hands both over): the continuation, queued or still fetching its blocks, never runs on the new
    weights after a token of the old."""
    prompt, params = cases()[3]
    prefill = make_engine(model, cache_server.address)
    decode = make_engine(model, cache_server.address if with_l3 else None)
    try:
        first = collect(prefill.submit(GenerationRequest("", prompt, params, prefill_only=True)))
        given = Continuation(first[0], first[1], first[2][0])
        with decode._lock:                      # the loop waits on this condition: it sees both at once
            stream = decode.submit(GenerationRequest("", prompt, params, continuation=given))
            decode.load_weights(1, model.state_dict())
        ids, _, _, last, _ = collect(stream)
        assert ids == [] and last.finish_reason is FinishReason.ERROR and last.retryable, last
        assert "weight" in last.error and "version" in last.error
        assert decode.wait_for_version(1)
    finally:
        prefill.close()
        decode.close()
