"""The embedded torch engine between requests: weight swaps at step boundaries (stamped versions, aborts, refused
and stale versions, drafts dropped after a swap), refusals of bad requests and of a full queue, the figures its
Stats report, a group's shared prefix computed once, and the CPU threads and KV events it owns."""

from __future__ import annotations

import math
import random

import pytest
import torch

from forge.actors.backend import FinishReason, GenerationRequest, InvalidRequest, Overloaded
from forge.model import CausalLM
from forge.model.generate import generate
from forge.sampling.params import SamplingParams

from helpers.engines import (
    engine_for,
    make_model,
    run,
)
from helpers.waiting import wait_for


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model(0)


def test_weight_swap_applies_between_steps_and_stamps_versions(model):
    other = make_model(9)
    engine = engine_for(model, speculative=True)
    try:
        stream = engine.submit(GenerationRequest("", [1, 2, 3], SamplingParams(temperature=0, max_tokens=300,
                                                                                ignore_eos=True)))
        seen = stream.get(timeout=30)
        engine.load_weights(1, other.state_dict())
        chunks = [seen, *stream]
        versions = [v for chunk in chunks for v in chunk.weight_versions]
        assert versions[0] == 0 and versions[-1] == 1
        assert versions == sorted(versions)
        for chunk in chunks:                   # one step, one version
            assert len(set(chunk.weight_versions)) <= 1
        fresh = run(engine, [1, 2, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        expected = generate(other, [1, 2, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        assert fresh[0] == expected.token_ids and set(fresh[2]) == {1}
        assert engine.weight_version == 1
    finally:
        engine.close()


def test_weight_swap_can_abort_in_flight_requests(model):
    engine = engine_for(model, on_weight_swap="abort")
    try:
        stream = engine.submit(GenerationRequest("", [1, 2], SamplingParams(max_tokens=400, ignore_eos=True)))
        stream.get(timeout=30)
        engine.load_weights(1, make_model(2).state_dict())
        assert list(stream)[-1].finish_reason is FinishReason.ABORT
    finally:
        engine.close()


def test_mismatched_or_stale_weights_are_refused_and_the_old_version_stays(model):
    engine = engine_for(model)
    try:
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["model.norm.weight"] = torch.ones(7)
        with pytest.raises(ValueError, match="does not fit"):
            engine.load_weights(1, state)
        engine.load_weights(3, model.state_dict())
        with pytest.raises(ValueError, match="not newer"):
            engine.load_weights(2, model.state_dict())
        assert engine.wait_for_version(3, timeout=10)
    finally:
        engine.close()


@pytest.mark.parametrize("prompt, params, message", [
    ([], SamplingParams(), "empty"),
    ([1, 101], SamplingParams(), "outside the vocabulary"),
    ([-1], SamplingParams(), "outside the vocabulary"),
    (list(range(100)) * 6, SamplingParams(), "context"),
    ([1], SamplingParams(stop_token_ids=(500,)), "stop token"),
    (list(range(100)) * 5, SamplingParams(min_tokens=100), "min_tokens"),
])
def test_bad_requests_are_refused_with_a_reason(model, prompt, params, message):
    engine = engine_for(model)
    try:
        with pytest.raises(InvalidRequest, match=message):
            engine.submit(GenerationRequest("", prompt, params))
        assert run(engine, [1, 2], SamplingParams(max_tokens=3))[3].finish_reason is FinishReason.LENGTH
    finally:
        engine.close()


def test_a_full_queue_refuses_with_overloaded(model):
    engine = engine_for(model, max_num_seqs=1, max_waiting=1)
    try:
        long = SamplingParams(max_tokens=300, ignore_eos=True)
        engine.submit(GenerationRequest("a", [1], long))
        engine.submit(GenerationRequest("b", [1], long))
        with pytest.raises(Overloaded, match="queue is full"):
            engine.submit(GenerationRequest("c", [1], long))
    finally:
        engine.close()
    engine = engine_for(model)
    try:
        engine.submit(GenerationRequest("a", [1], SamplingParams(max_tokens=300, ignore_eos=True)))
        with pytest.raises(InvalidRequest, match="already in flight"):
            engine.submit(GenerationRequest("a", [1], SamplingParams()))
    finally:
        engine.close()


def test_stats_report_the_figures_telemetry_needs(model):
    engine = engine_for(model)
    try:
        run(engine, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        stats = engine.stats()
        for key in ("tokens_per_s", "running", "waiting", "kv_used_frac", "prefix_hit_rate", "spec_acceptance",
                    "weight_version", "preemptions"):
            assert key in stats and math.isfinite(stats[key])
        assert stats["tokens"] == 5
    finally:
        engine.close()


def test_group_rollouts_of_one_prompt_compute_its_prefix_once(model):
    engine = engine_for(model)
    prompt = [random.Random(11).randrange(100) for _ in range(97)]
    try:
        streams = [engine.submit(GenerationRequest("", prompt, SamplingParams(seed=i, max_tokens=4)))
                   for i in range(8)]
        for stream in streams:
            list(stream)
        blocks = engine.blocks
        assert blocks.hit_tokens == 7 * (96 // 8) * 8      # all but the first rollout reuse every full block
    finally:
        engine.close()


def test_decoding_right_after_a_weight_swap_drops_drafts_safely(model):
    engine = engine_for(model, speculative=True, block_size=4)
    try:
        streams = [engine.submit(GenerationRequest("", [i + 1] * (3 + i), SamplingParams(max_tokens=60,
                                                                                         ignore_eos=True)))
                   for i in range(6)]
        for stream in streams:
            stream.get(timeout=30)
        for version in range(1, 6):            # every swap drops the drafts of running requests
            engine.load_weights(version, model.state_dict())
            assert engine.wait_for_version(version, timeout=30)
        finals = [list(stream)[-1] for stream in streams]
        assert all(chunk.finish_reason is FinishReason.LENGTH for chunk in finals), [c.error for c in finals]
    finally:
        engine.close()


def test_the_engine_loop_owns_the_cpu_threads_it_is_given(model):
    from forge.actors.engine.cpu_threads import reserve_cpu_threads

    before = torch.get_num_threads()
    try:
        threads = reserve_cpu_threads(3)
        assert threads == 3 and torch.get_num_threads() == 1      # the caller no longer starts thread teams
        engine = engine_for(model, threads=threads)
        try:
            run(engine, [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
            assert engine.stats()["threads"] == 3
            assert torch.get_num_threads() == 1                    # set per thread: the loop's count stays its own
        finally:
            engine.close()
        assert reserve_cpu_threads() == 1                          # 0 = keep what the caller had
    finally:
        torch.set_num_threads(before)


def test_an_engine_without_a_kv_connector_keeps_no_kv_events(model):
    from forge.actors.engine.l3 import KVConnector

    engine = engine_for(model, kv_cache_bytes=2**19)          # 85 blocks of 8 tokens: the requests evict each other
    rng = random.Random(12)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    try:
        for _ in range(40):
            run(engine, [rng.randrange(100) for _ in range(48)], params)
        blocks = engine.blocks
        assert engine.stats()["finished"] == 40 and blocks.lookups == 40
        assert not blocks.stored and not blocks.evicted       # nobody drains them: none kept
        connector = KVConnector(engine)                       # a consumer from now on: recorded, then drained
        run(engine, [rng.randrange(100) for _ in range(48)], params)
        wait_for(lambda: connector.events.sequence >= 48 // 8 and not blocks.stored,
                 "the request's blocks to be recorded and drained", interval_s=0.01)
    finally:
        engine.close()
