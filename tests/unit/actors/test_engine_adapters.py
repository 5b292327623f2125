"""Named adapters on the torch engine (several runs on one actor): requests naming different adapters, decoded in the
same steps, are each sampled with their own adapter over the shared base weights (the side path equals the merged
model), requests naming none with the base; each adapter's versions swap on their own; adapters' KV blocks are
never shared with the base's or each other's; what does not fit is refused."""

from __future__ import annotations

import threading

import pytest
import torch

from forge.actors.backend import GenerationRequest, InvalidRequest
from forge.sampling.params import SamplingParams

from helpers.engines import engine_for, full_forward_logprobs
from helpers.learner_runs import CONFIG, MOE_CONFIG, make_model
from helpers.lora import adapted_run
from helpers.random_model import copy_of

SAMPLED = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)


def submit_together(engine, requests: list[GenerationRequest]) -> list[tuple[list[int], list[float], list[int], int]]:
    """Submit every request before reading any (so that they share steps); per request its tokens, log-probs,
    versions and cached prompt tokens."""
    streams = [engine.submit(request) for request in requests]
    results: list = [None] * len(streams)

    def read(i: int) -> None:
        tokens, logprobs, versions, cached = [], [], [], 0
        for chunk in streams[i]:
            tokens += chunk.token_ids
            logprobs += chunk.logprobs
            versions += chunk.weight_versions
            cached = max(cached, chunk.cached_prompt_tokens)
        results[i] = (tokens, logprobs, versions, cached)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    return results


@pytest.mark.parametrize("config", [CONFIG, MOE_CONFIG], ids=["dense", "moe"])
def test_requests_naming_adapters_are_sampled_with_theirs_in_one_batch(config):
    base = make_model(1, config)
    runs = {"run-a": adapted_run(base, 2), "run-b": adapted_run(base, 3)}
    engine = engine_for(copy_of(base))
    try:
        for version, (name, (weights, _)) in enumerate(runs.items(), start=5):
            engine.load_adapter(name, version, weights)
        engine.submit(GenerationRequest("", [1], SamplingParams(max_tokens=1))).finished.wait()   # both installed
        assert engine.adapter_versions == {"run-a": 5, "run-b": 6}
        prompt = [3, 1, 4, 1, 5, 9, 2, 6]
        names = ["", "run-a", "run-b", "run-a", "", "run-b"]
        results = submit_together(engine, [GenerationRequest(f"r{i}", prompt, SamplingParams(
            temperature=1.0, max_tokens=10, ignore_eos=True, seed=i), adapter=name) for i, name in enumerate(names)])
        for name, (tokens, logprobs, versions, _) in zip(names, results, strict=True):
            model = runs[name][1] if name else base
            assert logprobs == pytest.approx(full_forward_logprobs(model, prompt, tokens, SAMPLED), abs=1e-4), name
            assert set(versions) == {engine.adapter_versions[name] if name else engine.weight_version}
        by_name = {name: [r[0] for n, r in zip(names, results, strict=True) if n == name] for name in set(names)}
        assert by_name["run-a"] != by_name["run-b"]      # different policies, different seeds: the test can tell
    finally:
        engine.close()


def test_each_adapter_swaps_on_its_own_and_keeps_its_own_kv():
    base = make_model(1)
    engine = engine_for(copy_of(base))
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = list(range(1, 40))                # several full KV blocks
    try:
        engine.load_adapter("run-a", 1, adapted_run(base, 2)[0])
        engine.load_adapter("run-b", 1, adapted_run(base, 3)[0])
        first = submit_together(engine, [GenerationRequest("", prompt, greedy)])[0]
        assert first[3] == 0
        cold = submit_together(engine, [GenerationRequest("", prompt, greedy, adapter="run-a")])[0]
        assert cold[3] == 0                    # the base's blocks are not run-a's
        warm = submit_together(engine, [GenerationRequest("", prompt, greedy, adapter="run-a")])[0]
        assert warm[3] > 0 and warm[0] == cold[0]
        assert submit_together(engine, [GenerationRequest("", prompt, greedy, adapter="run-b")])[0][3] == 0

        weights, merged = adapted_run(base, 4)
        engine.load_adapter("run-a", 2, weights)
        swapped = submit_together(engine, [GenerationRequest("", prompt, greedy, adapter="run-a")])[0]
        assert swapped[3] == 0 and set(swapped[2]) == {2}
        assert swapped[1] == pytest.approx(full_forward_logprobs(merged, prompt, swapped[0], greedy), abs=1e-4)
        assert engine.adapter_versions == {"run-a": 2, "run-b": 1}
        assert set(submit_together(engine, [GenerationRequest("", prompt, greedy, adapter="run-b")])[0][2]) == {1}
    finally:
        engine.close()


def test_what_does_not_fit_is_refused():
    base = make_model(1)
    engine = engine_for(copy_of(base))
    weights = adapted_run(base, 2)[0]
    try:
        with pytest.raises(InvalidRequest, match="no adapter named 'run-a'"):
            engine.submit(GenerationRequest("", [1, 2], SAMPLED, adapter="run-a"))
        with pytest.raises(ValueError, match="whole-model weights"):
            engine.load_adapter("run-a", 1, base.state_dict())
        a_name = next(n for n in weights if n.endswith(".lora_A.weight"))
        with pytest.raises(ValueError, match="does not fit its weight"):
            engine.load_adapter("run-a", 1, {**weights, a_name: torch.zeros(4, 7)})
        with pytest.raises(ValueError, match="not a linear projection"):
            engine.load_adapter("run-a", 1, {**weights, "model.layers.9.mlp.up_proj.lora_A.weight": weights[a_name]})
        with pytest.raises(ValueError, match="adapter name"):
            engine.load_adapter("a b", 1, weights)
        engine.load_adapter("run-a", 3, weights)
        with pytest.raises(ValueError, match="not newer than 3"):
            engine.load_adapter("run-a", 3, weights)
        engine.submit(GenerationRequest("", [1], SamplingParams(max_tokens=1), adapter="run-a")).finished.wait()
        with pytest.raises(InvalidRequest, match="served whole"):
            engine.submit(GenerationRequest("", [1, 2], SAMPLED, adapter="run-a", prefill_only=True))
    finally:
        engine.close()


def cli_refusal(command, *args: str) -> str:
    from click.testing import CliRunner

    result = CliRunner().invoke(command, list(args))
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    return errors[0]


def test_the_adapter_options_are_checked_before_anything_loads(tmp_path):
    from forge.actors.cli import actor
    from forge.gateway.cli import gateway

    link = "run-a=tcp://127.0.0.1:5611,tcp://127.0.0.1:5612"
    assert "NAME=FETCH,ANNOUNCE" in cli_refusal(actor, "--adapter", "run-a=tcp://127.0.0.1:5611")
    assert "adapter name" in cli_refusal(actor, "--adapter", "a b=tcp://127.0.0.1:1,tcp://127.0.0.1:2")
    assert "needs a host and a port" in cli_refusal(actor, "--adapter", "run-a=tcp://127.0.0.1,tcp://127.0.0.1:2")
    assert "given twice" in cli_refusal(actor, "--adapter", link, "--adapter", link)
    assert "needs the torch or vLLM backend" in cli_refusal(actor, "--adapter", link, "--backend", "trtllm")
    assert "--compile-decode" in cli_refusal(actor, "--adapter", link, "--compile-decode")
    assert "does not go with --weights-fetch" in cli_refusal(
        actor, "--adapter", link, "--weights-fetch", "tcp://127.0.0.1:5601", "--weights-announce",
        "tcp://127.0.0.1:5602")
    assert "vLLM takes one of" in cli_refusal(actor, "--adapter", link, "--max-adapter-rank", "4")
    from forge.weights.curve import create_keys

    keys = create_keys(tmp_path / "keys", ["actor-0"])
    actor_key = ["--weights-key", str(keys.client_secrets["actor-0"])]
    assert "give its learner's certificate" in cli_refusal(actor, "--adapter", link, *actor_key)
    assert "goes with --weights-key" in cli_refusal(actor, "--adapter", f"{link},{keys.server_public}")
    assert "--weights-server-key names the learner" in cli_refusal(
        actor, "--adapter", f"{link},{keys.server_public}", *actor_key, "--weights-server-key",
        str(keys.server_public))
    assert "cannot read the key file" in cli_refusal(actor, "--adapter", f"{link},{tmp_path}/none.key", *actor_key)
    pool = ["--pool", str(tmp_path / "pool")]
    assert "adapter name" in cli_refusal(gateway, *pool, "--actor", "127.0.0.1:1", "--adapter", "-x")
    assert "--prefill-actor" in cli_refusal(gateway, *pool, "--actor", "127.0.0.1:1", "--prefill-actor",
                                            "127.0.0.1:2", "--adapter", "run-a")
