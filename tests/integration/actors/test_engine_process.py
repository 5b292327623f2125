"""The torch engine in a process of its own (EngineProcess front + engine core): the same tokens and log-probs as
the engine in process, the same errors at submit, aborts, weights through the pipe, KV events, and no request left
hanging when either process dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from forge.actors.backend import FinishReason, GenerationRequest, InvalidRequest, Overloaded
from forge.actors.config import EngineConfig
from forge.actors.engine.core import EngineSpec
from forge.actors.engine.engine import TorchEngine
from forge.actors.engine.process import EngineProcess
from forge.sampling.params import SamplingParams

from helpers.random_model import random_model, small_config
from helpers.waiting import wait_for

CONFIG = small_config(vocab_size=97, hidden_size=48, intermediate_size=96, head_dim=12, max_position_embeddings=256)
ENGINE = EngineConfig(kv_cache_bytes=2 * 2**20, block_size=8, threads=1, model_id="test")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(random_model(CONFIG, 0, std=0.2).save_pretrained(tmp_path_factory.mktemp("ckpt")))


@pytest.fixture(scope="module")
def engine(checkpoint):
    front = EngineProcess(EngineSpec(checkpoint, config=ENGINE, kv_events=True), start_timeout_s=120)
    yield front
    front.close()


def requests() -> list[GenerationRequest]:
    sampling = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                SamplingParams(temperature=1.0, max_tokens=30, seed=5),
                SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=25, seed=9, ignore_eos=True),
                SamplingParams(temperature=1.3, max_tokens=40, seed=2, stop_token_ids=(3, 4))]
    prompts = [[1, 2, 3], [5] * 20, list(range(10, 40)), [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    return [GenerationRequest(f"r{i}", prompt, params, stream_interval=i % 3)
            for i, (prompt, params) in enumerate(zip(prompts, sampling, strict=True))]


def collect(backend, batch: list[GenerationRequest]) -> dict[str, tuple[list[int], list[float], str]]:
    streams = [backend.submit(request) for request in batch]
    out = {}
    for stream in streams:
        chunks = list(stream)
        out[stream.request_id] = ([t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs],
                                  chunks[-1].finish_reason)
    return out


def test_outputs_equal_the_engine_in_process(engine):
    local = TorchEngine(random_model(CONFIG, 0, std=0.2), ENGINE)
    try:
        expected = collect(local, requests())
    finally:
        local.close()
    got = collect(engine, requests())
    assert got.keys() == expected.keys()
    for request_id, (tokens, logprobs, finish) in expected.items():
        assert got[request_id][0] == tokens, request_id
        assert got[request_id][1] == pytest.approx(logprobs, abs=1e-5), request_id
        assert got[request_id][2] == finish
    assert engine.stats()["finished"] >= 4


@pytest.mark.parametrize("prompt, params, message", [
    ([], SamplingParams(), "prompt is empty"),
    ([1, 200], SamplingParams(), "outside the vocabulary"),
    (list(range(1, 90)) * 3, SamplingParams(), "the model's context is 256"),
    ([1], SamplingParams(stop_token_ids=(500,)), "stop token ids outside"),
])
def test_bad_requests_fail_at_submit_with_the_reason(engine, prompt, params, message):
    with pytest.raises(InvalidRequest, match=message):
        engine.submit(GenerationRequest("bad", prompt, params))
    assert collect(engine, [GenerationRequest("", [1, 2], SamplingParams(max_tokens=3, ignore_eos=True))])


def test_abort_ends_the_stream_and_frees_its_blocks(engine):
    stream = engine.submit(GenerationRequest("long", [1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True)))
    first = stream.get(timeout=30)
    assert first.token_ids and first.finish_reason is None
    with pytest.raises(InvalidRequest, match="already in flight"):
        engine.submit(GenerationRequest("long", [1], SamplingParams()))
    assert engine.abort("long")
    assert list(stream)[-1].finish_reason is FinishReason.ABORT
    assert not engine.abort("long")
    wait_for(lambda: not ((stats := engine.stats())["running"] or stats["kv_used_frac"]),
             "the aborted request's blocks to be freed")


def test_weights_through_the_pipe_apply_between_steps(engine):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    new = random_model(CONFIG, 4, std=0.2)
    with pytest.raises(ValueError, match="does not fit the model"):
        engine.load_weights(1, {"nope": torch.zeros(2)})
    engine.load_weights(1, new.state_dict())
    assert engine.wait_for_version(1, timeout=30) and engine.weight_version == 1
    with pytest.raises(ValueError, match="not newer"):
        engine.load_weights(1, new.state_dict())
    chunks = list(engine.submit(GenerationRequest("", [4, 5, 6], greedy)))
    local = TorchEngine(new, ENGINE)
    try:
        expected = [t for c in local.submit(GenerationRequest("", [4, 5, 6], greedy)) for t in c.token_ids]
    finally:
        local.close()
    assert [t for c in chunks for t in c.token_ids] == expected
    assert {v for c in chunks for v in c.weight_versions} == {1}


def test_kv_events_and_layout_come_from_the_core(engine):
    log, describe = engine.kv_events()
    collect(engine, [GenerationRequest("", list(range(1, 30)), SamplingParams(max_tokens=2, ignore_eos=True))])
    answer = log.poll("", 0)
    assert answer.snapshot and answer.epoch and answer.events[0].block_hashes
    again = log.poll(answer.epoch, answer.sequence)
    assert not again.snapshot and not again.events
    layout, figures = describe()
    assert layout.model_id == "test" and layout.block_size == 8 and "running" in figures


def test_a_full_queue_is_refused_and_close_aborts_what_runs(checkpoint):
    config = EngineConfig(kv_cache_bytes=2 * 2**20, block_size=8, threads=1, max_num_seqs=1, max_waiting=1)
    front = EngineProcess(EngineSpec(checkpoint, config=config), start_timeout_s=120)
    try:
        long = SamplingParams(max_tokens=200, ignore_eos=True)
        streams = [front.submit(GenerationRequest(f"q{i}", [1, 2], long)) for i in range(2)]
        with pytest.raises(Overloaded, match="queue is full"):
            front.submit(GenerationRequest("q2", [1, 2], long))
        assert front.stats()["refused"] == 1
        streams[0].get(timeout=30)
    finally:
        front.close()
    assert all(list(stream)[-1].finish_reason is FinishReason.ABORT for stream in streams)
    assert not front.failed


def test_a_dead_core_fails_its_streams_and_refuses_new_work(checkpoint):
    exits = []
    front = EngineProcess(EngineSpec(checkpoint, config=ENGINE), start_timeout_s=120, on_exit=exits.append)
    try:
        stream = front.submit(GenerationRequest("", [1, 2], SamplingParams(max_tokens=10_000, ignore_eos=True)))
        stream.get(timeout=30)
        os.kill(front.pid, signal.SIGKILL)
        last = list(stream)[-1]
        assert last.finish_reason is FinishReason.ERROR and "not running" in last.error
        wait_for(lambda: exits, "the exit to be told")             # told after the streams are failed
        assert front.failed and "code -9" in exits[0]
        with pytest.raises(Overloaded, match="not running"):
            front.submit(GenerationRequest("", [1], SamplingParams()))
        with pytest.raises(RuntimeError, match="not running"):
            front.stats()
    finally:
        front.close()


def test_the_core_exits_when_its_front_is_killed(checkpoint):
    script = textwrap.dedent(f"""
        import sys, time
        from forge.actors.engine.core import EngineSpec
        from forge.actors.config import EngineConfig
        from forge.actors.engine.process import EngineProcess
        front = EngineProcess(EngineSpec({checkpoint!r}, config=EngineConfig(kv_cache_bytes=2**20, block_size=8,
                                                                             threads=1)))
        print(front.pid, flush=True)
        time.sleep(600)
    """)
    front = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        core = int(front.stdout.readline())
        front.kill()
        front.wait(timeout=30)
        wait_for(lambda: not _alive(core), "the engine core to exit after its front")
    finally:
        front.kill()


def test_a_model_that_cannot_load_is_reported_at_start(tmp_path):
    with pytest.raises(RuntimeError, match=r"could not start: .*no config\.json"):
        EngineProcess(EngineSpec(str(tmp_path), config=ENGINE), start_timeout_s=120)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                   # a zombie (not reaped yet, parent gone) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
