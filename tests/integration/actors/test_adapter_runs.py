"""Two runs on one actor: each run's learner publishes its own LoRA adapter versions, one forge-actor process (its
engine core, or vLLM with a LoRA adapter per run) serves both beside the shared base, and each run's gateway names its adapter. Every session's calls are
sampled with its run's adapter (the learner's recomputation with that run's merged model gives the recorded
log-probs) and land in its run's pool; a new version of one run's adapter leaves the other run's untouched. The vLLM
actor is then killed (``kill -9``): its reaper ends vLLM's engine core and workers, which nothing else would (they
would hold their memory, on a GPU the device's, until someone found them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import grpc
import pytest

from forge.model.qwen3 import CausalLM
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from forge.weights import WeightPublisher

from helpers.gateway_procs import calls_of, chat_calls, start_gateway
from helpers.lora import adapted_run
from helpers.processes import start_actor, wait_gone
from helpers.random_model import random_tiny
from helpers.recompute import learner_and_recorded
from helpers.waiting import wait_for

RUNS = ("run-a", "run-b")
BACKENDS = [pytest.param((), id="torch"),
            pytest.param(("--backend", "vllm", "--max-adapter-rank", "8"), id="vllm",
                         marks=[pytest.mark.vllm, pytest.mark.slow])]


def merged_checkpoint(base_dir, directory, merged: CausalLM):
    """``merged``'s weights in a copy of the base checkpoint (its tokenizer and config)."""
    shutil.copytree(base_dir, directory)
    merged.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_runs_share_one_actor_each_with_its_adapter_and_pool(tmp_path, backend):
    base_dir = random_tiny(tmp_path)
    base = CausalLM.from_pretrained(base_dir)
    publishers = {run: WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") for run in RUNS}
    started = []
    engine_processes: list[int] = []         # vLLM's: ended here should the test fail before its kill
    try:
        merged = {}
        for seed, run in enumerate(RUNS, start=1):
            version, merged[run] = adapted_run(base, seed)
            publishers[run].publish(1, version)          # published before the actor starts: it waits for both
        links = [arg for run in RUNS for arg in ("--adapter", f"{run}={publishers[run].fetch_endpoint},"
                                                               f"{publishers[run].announce_endpoint}")]
        actor = start_actor(tmp_path, "--model", str(base_dir), *links, *backend, timeout_s=900)
        started.append(actor)
        if "vllm" in backend:
            engine_processes = vllm_processes_of(actor)
        gateways = {}
        for run in RUNS:
            gateways[run] = start_gateway(tmp_path, [actor.address], tmp_path / f"pool-{run}", "--model",
                                          str(base_dir), "--adapter", run, name=f"gateway-{run}")
            started.append(gateways[run])

        def check_run(run: str, version: int, tag: str) -> None:
            sessions = chat_calls(gateways[run], f"{run}-{tag}", 2)
            calls = calls_of(tmp_path / f"pool-{run}", sessions)
            assert len(calls) == 4 and {c.adapter for c in calls} == {run}
            assert {v for c in calls for v in c.weight_versions} == {version}
            checkpoint = merged_checkpoint(base_dir, tmp_path / f"{run}-{tag}-merged", merged[run])
            learner, recorded = learner_and_recorded(checkpoint, calls)
            assert learner.tolist() == pytest.approx(recorded.tolist(), abs=2e-4)
            other = next(r for r in RUNS if r != run)
            others, _ = learner_and_recorded(merged_checkpoint(base_dir, tmp_path / f"{other}-{tag}-as-{run}",
                                                               merged[other]), calls)
            assert others.tolist() != pytest.approx(recorded.tolist(), abs=1e-2)    # the runs can be told apart

        for run in RUNS:
            check_run(run, 1, "first")

        version, merged["run-b"] = adapted_run(base, 7)
        publishers["run-b"].publish(2, version)
        wait_for(lambda: adapter_version_of(actor, "run-b") == 2, "the actor to serve run-b's version 2")
        check_run("run-b", 2, "second")
        check_run("run-a", 1, "second")
        if "vllm" in backend:
            started.remove(actor)
            actor.stop(signal.SIGKILL)
            wait_gone(engine_processes)
            engine_processes = []
    finally:
        for proc in reversed(started):
            proc.stop()
        for publisher in publishers.values():
            publisher.close()
        for pid in engine_processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def vllm_processes_of(actor) -> list[int]:
    """The actor's children and grandchildren, as it started them: vLLM's engine core (one of them) and workers."""
    from forge.reaper import child_pids

    children = child_pids(actor.proc.pid)
    found = children + [grandchild for child in children for grandchild in child_pids(child)]
    titles = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in found]
    assert any(b"EngineCore" in title for title in titles), titles
    return found


def adapter_version_of(actor, run: str) -> int:
    """The version of adapter ``run`` the actor serves (its first sampled token says: one greedy token)."""
    request = actor_pb2.GenerateRequest(prompt_ids=[1, 2], adapter=run, sampling=common_pb2.SamplingParams(
        temperature=0, max_tokens=1))
    with grpc.insecure_channel(actor.address) as channel:
        chunks = list(actor_pb2_grpc.ActorStub(channel).Generate(request, timeout=60))
    return chunks[0].weight_versions[0]


def test_an_actor_refuses_a_request_naming_an_adapter_it_does_not_serve(tmp_path):
    actor = start_actor(tmp_path)
    try:
        request = actor_pb2.GenerateRequest(prompt_ids=[1, 2], adapter="run-x",
                                            sampling=common_pb2.SamplingParams(max_tokens=1))
        with grpc.insecure_channel(actor.address) as channel, pytest.raises(grpc.RpcError) as err:
            list(actor_pb2_grpc.ActorStub(channel).Generate(request, timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no adapter named 'run-x'" in err.value.details()
    finally:
        assert actor.stop() == 0
