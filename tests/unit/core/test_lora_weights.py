"""Adapter versions (forge.model.lora_weights): what the learner sends when it publishes LoRA adapters alone merges,
on the actor, into bit for bit the weights its checkpoints hold; the torch engine serves each version with the
merged model's tokens and log-probs (each onto the base it started from, never onto the previous version); malformed
versions, and adapter versions for a backend that does not merge them, are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from forge.actors.backend import check_weights
from forge.app.up.config import UpConfig
from forge.app.up.plan import Plan
from forge.learner.lora import LoraConfig, adapter_version, add_adapters, merged_state_dict
from forge.model.generate import generate
from forge.model.lora_weights import SCALING, merge_adapter_version
from forge.sampling.params import SamplingParams
from forge.settings import SettingsError

from helpers.engines import engine_for, run
from helpers.learner_runs import CONFIG, make_model
from helpers.random_model import copy_of

LORA = LoraConfig(rank=4, alpha=8.0, publish="adapters")
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def trained_adapters(base, seed: int):
    """A copy of ``base`` with adapters as training would leave them (random A and B), and its merged twin."""
    adapted = add_adapters(copy_of(base), LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if ".lora_" in name or name.startswith("mtp."):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    merged = copy_of(base)
    merged.load_state_dict(merged_state_dict(adapted.state_dict(), LORA))
    return adapted, merged


def test_an_adapter_version_merges_into_the_learner_s_merged_weights_bit_for_bit():
    base = make_model(1, CONFIG)
    adapted, merged = trained_adapters(base, seed=2)
    version = adapter_version(adapted.state_dict(), LORA)
    assert all(".lora_" in name or name.startswith("mtp.") or name == SCALING for name in version)
    sent = sum(t.numel() * t.element_size() for n, t in version.items() if not n.startswith("mtp."))
    assert sent < sum(t.numel() * t.element_size() for t in base.state_dict().values()) / 4
    rebuilt = merge_adapter_version(base.state_dict(), version)
    assert rebuilt.keys() == merged.state_dict().keys()
    for name, tensor in merged.state_dict().items():
        assert torch.equal(rebuilt[name], tensor), name


def test_a_malformed_adapter_version_is_refused():
    base = make_model(1, CONFIG)
    version = adapter_version(trained_adapters(base, seed=3)[0].state_dict(), LORA)
    a_name = next(n for n in version if n.endswith(".lora_A.weight"))
    for broken, says in [({**version, "model.layers.9.self_attn.q_proj.lora_A.weight": version[a_name]}, "unknown"),
                         ({n: t for n, t in version.items() if n != a_name.replace("lora_A", "lora_B")}, "unpaired"),
                         ({n: t for n, t in version.items() if n != a_name}, "does not fit"),
                         ({**version, a_name: torch.zeros(4, 7)}, "does not fit its weight")]:
        with pytest.raises(ValueError, match=says):
            merge_adapter_version(base.state_dict(), broken)
    with pytest.raises(ValueError, match="holds LoRA adapters only"):
        check_weights(1, version, {n: t.shape for n, t in base.state_dict().items()})


def test_the_engine_serves_each_adapter_version_as_its_merged_model():
    base = make_model(1, CONFIG)
    engine = engine_for(copy_of(base))
    try:
        for version, seed in ((1, 4), (2, 5)):       # each onto the base, not onto the version before
            adapted, merged = trained_adapters(base, seed)
            engine.load_weights(version, adapter_version(adapted.state_dict(), LORA))
            tokens, logprobs, versions = run(engine, [1, 2, 3], GREEDY)[:3]
            expected = generate(merged, [1, 2, 3], GREEDY)
            assert tokens == expected.token_ids and set(versions) == {version}
            assert logprobs == pytest.approx(expected.logprobs, abs=2e-5)
            for name, tensor in merged.state_dict().items():
                assert torch.equal(engine.model.state_dict()[name].cpu(), tensor), name
        engine.load_weights(3, base.state_dict())            # whole weights may follow
        assert run(engine, [1, 2, 3], GREEDY)[0] == generate(base, [1, 2, 3], GREEDY).token_ids
    finally:
        engine.close()


def test_an_adapter_version_after_whole_weights_is_refused():
    base = make_model(1, CONFIG)
    engine = engine_for(copy_of(base))
    try:
        engine.load_weights(1, make_model(2, CONFIG).state_dict())
        with pytest.raises(ValueError, match="came after whole-model versions"):
            engine.load_weights(2, adapter_version(trained_adapters(base, 6)[0].state_dict(), LORA))
    finally:
        engine.close()


def test_publishing_adapters_is_a_choice_of_the_learner_s():
    assert LoraConfig().publish == "merged"
    with pytest.raises(ValueError):
        dataclasses.replace(LORA, publish="deltas")


def test_forge_up_refuses_adapter_versions_for_actors_that_cannot_merge_them():
    lora = {"lora_rank": 4, "lora_publish": "adapters"}
    Plan(UpConfig().with_services(learner=lora))                     # the torch engine merges them
    Plan(UpConfig().with_services(learner={"lora_rank": 4}, actor={"backend": "trtllm"}))   # merged: any backend
    with pytest.raises(SettingsError, match="needs actors that merge adapter versions"):
        Plan(UpConfig().with_services(learner=lora, actor={"backend": "trtllm"}))
