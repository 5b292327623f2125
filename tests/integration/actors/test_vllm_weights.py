"""vLLM as an actor backend across weight versions: named adapters, an actor process following a real learner,
models with experts and other families, each against the torch engine and the learner. (Swaps, a LoRA adapter
version and KV events on the tiny model are in test_vllm_backend.py, on its engine; a killed vLLM actor in
test_adapter_runs.py, on its actor.)"""

from __future__ import annotations

import grpc
import pytest
import torch

from forge.actors.backend import GenerationRequest, InvalidRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.checkpoints import load_model, resolve_model
from forge.model import CausalLM
from forge.sampling.params import SamplingParams
from forge.sampling.sampling import sampling_logprobs
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from integration.actors.test_vllm_backend import KV, PROMPTS, learner_logprobs, picked, run, seeded, torch_engine

from helpers.families import SERVABLE, write_family
from helpers.lora import adapted_run
from helpers.processes import start_actor
from helpers.random_model import random_tiny, random_tiny_moe
from helpers.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_named_adapters_are_vllm_loras_each_sampled_as_its_runs_merged_model(tmp_path):
    """Several runs on one vLLM actor: each named adapter version becomes a vLLM LoRA adapter; requests of both runs
    and of the base, submitted together, each record the log-probs their own (merged) model recomputes, stamped with
    their adapter's version; a run's new version replaces only its own."""
    from forge.actors.vllm.backend import VllmBackend

    directory = random_tiny(tmp_path / "tiny", seed=3)
    base = load_model(directory)[0].eval()
    runs = {"run-a": adapted_run(base, 2), "run-b": adapted_run(base, 5)}
    backend = VllmBackend(resolve_model(directory), EngineConfig(kv_cache_bytes=KV, threads=1, max_adapter_rank=8),
                          adapters=2)
    params = SamplingParams(temperature=1.0, seed=21, max_tokens=12, ignore_eos=True)
    names = ["", "run-a", "run-b", "run-a", "run-b", ""]

    def check(versions: dict[str, int]) -> list[list[int]]:
        streams = [backend.submit(GenerationRequest("", PROMPTS[i], seeded(params, i), adapter=name))
                   for i, name in enumerate(names)]
        got = []
        for i, (name, stream) in enumerate(zip(names, streams, strict=True)):
            chunks = list(stream)
            tokens = [t for c in chunks for t in c.token_ids]
            model = runs[name][1] if name else base
            expected = picked(learner_logprobs(model, PROMPTS[i], tokens, params, edited=False), tokens)
            torch.testing.assert_close(torch.tensor([x for c in chunks for x in c.logprobs]), expected, atol=1e-4,
                                       rtol=0)
            assert {v for c in chunks for v in c.weight_versions} == {versions.get(name, backend.weight_version)}
            got.append(tokens)
        return got

    try:
        with pytest.raises(InvalidRequest, match="no adapter named 'run-a'"):
            backend.submit(GenerationRequest("", PROMPTS[0], params, adapter="run-a"))
        for name, (version, _) in runs.items():
            backend.load_adapter(name, 1, version)
        assert backend.adapter_versions == {"run-a": 1, "run-b": 1}
        first = check({"run-a": 1, "run-b": 1})
        runs["run-b"] = adapted_run(base, 9)
        backend.load_adapter("run-b", 2, runs["run-b"][0])
        with pytest.raises(ValueError, match="not newer"):
            backend.load_adapter("run-b", 2, runs["run-b"][0])
        with pytest.raises(ValueError, match="serves 2 named adapters"):
            backend.load_adapter("run-c", 1, runs["run-a"][0])
        second = check({"run-a": 1, "run-b": 2})
        assert second[1] == first[1] and second[2] != first[2]
    finally:
        backend.close()


def test_an_actor_process_follows_a_real_learners_versions(tmp_path):
    """forge-learner trains on a pool and publishes; a vLLM forge-actor applies the versions; its greedy output
    after the swap equals the torch engine's on the same version's tensors (fetched from the learner here)."""
    from forge.pool import Pool
    from forge.weights import WeightSubscriber

    from helpers.processes import Service
    from helpers.rollouts import fill_pool

    directory = random_tiny(tmp_path)
    engine = torch_engine(directory)
    pool = Pool(tmp_path / "pool")
    fill_pool(pool, engine, groups=4, group_size=2, max_tokens=8)
    engine.close()
    pool.close()
    learner = Service("learner", "forge-learner", [
        "--pool", str(tmp_path / "pool"), "--run-dir", str(tmp_path / "run"), "--model", str(directory),
        "--batch-groups", "1", "--window", "1", "--lr", "1e-2", "--max-wait", "0.5",
        "--weights-fetch", "tcp://127.0.0.1:*", "--weights-announce", "tcp://127.0.0.1:*", "--port", "0"],
        tmp_path, timeout_s=300)
    received: dict[int, dict[str, torch.Tensor]] = {}
    subscriber = WeightSubscriber(learner.info["weights_fetch"], learner.info["weights_announce"],
                                  on_version=lambda version, tensors: received.__setitem__(version, dict(tensors)))
    actor = start_actor(tmp_path, "--backend", "vllm", "--model", str(directory), "--weights-fetch",
                        learner.info["weights_fetch"], "--weights-announce", learner.info["weights_announce"],
                        name="vllm-actor", timeout_s=900)
    try:
        with grpc.insecure_channel(actor.address) as channel:
            stub = actor_pb2_grpc.ActorStub(channel)
            wait_for(lambda: stub.Stats(common_pb2.StatsRequest()).gauges["weight_version"] >= 2,
                     "the learner's second version to reach the actor", 600)
            request = actor_pb2.GenerateRequest(prompt_ids=PROMPTS[2], sampling=common_pb2.SamplingParams(
                temperature=0, max_tokens=10, ignore_eos=True))
            chunks = list(stub.Generate(request, timeout=120))
            version, = {v for c in chunks for v in c.weight_versions}
            wait_for(lambda: version in received, f"version {version} to reach the test's subscriber", 600)
    finally:
        assert actor.stop() == 0
        subscriber.close()
        learner.stop()
    assert version >= 2
    model = CausalLM.from_pretrained(directory)
    model.load_state_dict(received[version])
    engine = TorchEngine(model.eval(), EngineConfig(kv_cache_bytes=KV))
    try:
        (want, _, _), = run(engine, [PROMPTS[2]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    finally:
        engine.close()
    assert [t for c in chunks for t in c.token_ids] == want


def test_a_model_with_experts_samples_what_the_torch_engine_samples_before_and_after_a_weight_swap(tmp_path):
    """vLLM serves Qwen3-MoE (the tiny-moe shape, random weights): greedy tokens and their log-probs equal the torch
    engine's, on the checkpoint and again after both take a new version in place (vLLM's CPU build packs its
    experts for its grouped kernel, and a reload must pack the new ones again)."""
    from forge.actors.vllm.backend import VllmBackend

    directory = random_tiny_moe(tmp_path)
    original = CausalLM.from_pretrained(directory).state_dict()
    new = {name: tensor * (1.0 + 0.05 * (i % 3)) for i, (name, tensor) in enumerate(original.items())}
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    backend = VllmBackend(resolve_model(directory), EngineConfig(kv_cache_bytes=KV, threads=1))
    try:
        ours_before = run(backend, PROMPTS, greedy)
        backend.load_weights(1, new)
        ours_after = run(backend, PROMPTS, greedy)
    finally:
        backend.close()
    engine = torch_engine(directory)
    try:
        theirs_before = run(engine, PROMPTS, greedy)
        engine.load_weights(1, new)
        assert engine.wait_for_version(1, timeout=60)
        theirs_after = run(engine, PROMPTS, greedy)
    finally:
        engine.close()
    assert [t[0] for t in theirs_before] != [t[0] for t in theirs_after], "the new version samples the same tokens"
    for ours, theirs, version in ((ours_before, theirs_before, 0), (ours_after, theirs_after, 1)):
        for (tokens, logprobs, versions), (want, want_logprobs, _) in zip(ours, theirs, strict=True):
            assert tokens == want and set(versions) == {version}
            torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM returns routed experts from its GPU model runner only")
def test_on_a_gpu_vllm_records_the_experts_it_routed_through(tmp_path):
    """With a model with experts on CUDA, vLLM's routed experts come back with the final chunk, one row per
    position it fed, and agree with the experts a forward pass of the same weights chooses (fp32: ties aside)."""
    from forge.actors.vllm.backend import VllmBackend
    from forge.model.moe import routing_of

    directory = random_tiny_moe(tmp_path)
    backend = VllmBackend(resolve_model(directory), EngineConfig(kv_cache_bytes=KV), device="cuda")
    try:
        streams = [backend.submit(GenerationRequest("", p, SamplingParams(temperature=1.0, max_tokens=10, seed=i,
                                                                          ignore_eos=True)))
                   for i, p in enumerate(PROMPTS[:4])]
        finals = [(prompt, list(stream)) for prompt, stream in zip(PROMPTS[:4], streams, strict=True)]
    finally:
        backend.close()
    model = CausalLM.from_pretrained(directory).eval()
    agree = total = 0
    for prompt, chunks in finals:
        record = chunks[-1].routed_experts
        assert record is not None
        tokens = [*prompt, *[t for c in chunks for t in c.token_ids]]
        assert record.ids.shape[0] == len(tokens) - 1 and (record.ids >= 0).all()
        with torch.no_grad():
            want = routing_of(model, tokens[:-1])
        agree += int((record.ids == want).all(axis=(1, 2)).sum())
        total += len(tokens) - 1
    assert agree >= 0.95 * total, f"{agree} of {total} positions routed as the model routes them"


def assert_learner_agrees(backend, policy, params: SamplingParams, prompts: list[list[int]]) -> list[int]:
    """The backend's samples of ``prompts`` carry the log-probs the learner's ``policy`` gives them; their versions."""
    versions = []
    for prompt, (tokens, logprobs, stamped) in zip(prompts, run(backend, prompts, params), strict=True):
        with torch.no_grad():
            logits = policy.logits(policy(torch.tensor([prompt + tokens])))[0, len(prompt) - 1:-1]
        expected = sampling_logprobs(logits, params.temperature).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)
        versions += stamped
    return versions


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_other_families_are_served_as_the_learner_computes_them_before_and_after_an_update(tmp_path, family):
    """A random Llama or Mistral written by transformers: vLLM's log-probs are the learner's transformers policy's,
    and a weight version from that policy's parameters (their checkpoint names) makes them the new policy's."""
    from forge.actors.vllm.backend import VllmBackend

    directory, _ = write_family(tmp_path / family, family, shape=SERVABLE, sliding_window=None)
    policy = load_model(directory)[0].eval()
    prompts = [[(5 * i + 3 * j) % 250 + 3 for j in range(4 + i)] for i in range(4)]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10, ignore_eos=True)
    backend = VllmBackend(resolve_model(directory), EngineConfig(kv_cache_bytes=KV, threads=1))
    try:
        assert set(assert_learner_agrees(backend, policy, params, prompts)) == {0}
        with torch.no_grad():
            for i, parameter in enumerate(policy.parameters()):
                parameter.mul_(1.0 + 0.2 * (i % 3))
        backend.load_weights(1, {name: tensor.clone() for name, tensor in policy.state_dict().items()})
        assert set(assert_learner_agrees(backend, policy, params, prompts)) == {1}
    finally:
        backend.close()
