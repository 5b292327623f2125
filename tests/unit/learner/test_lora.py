"""LoRA on the learner's policies (forge.learner.lora) against peft itself on the transformers model of the same
checkpoint: equal log-probabilities and adapter gradients on random inputs, Forge's own Qwen3 and a family trained
through transformers alike; the merged weights give the adapted model's logits; the saved adapter loads in peft."""

from __future__ import annotations

import re

import peft
import pytest
import torch
import transformers

from forge.checkpoints import load_model
from forge.checkpoints.random_qwen3 import write_qwen3
from forge.learner.lora import (
    ADAPTER,
    LoraConfig,
    adapted_modules,
    add_adapters,
    load_adapter,
    merged_state_dict,
    save_adapter,
    set_adapter,
    target_pattern,
    trainable_parameters,
)

from helpers.families import write_family
from helpers.lora import randomize_adapters

CONFIG = LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module", params=["qwen3-native", "llama-transformers"])
def checkpoint(request, tmp_path_factory):
    """(directory, vocabulary size) of a random checkpoint Forge loads natively or through transformers."""
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen3-native":
        return write_qwen3(directory, size="small", seed=3), 1024
    write_family(directory, "llama", seed=3)
    return directory, 96


def forge_policy(directory, seed: int = 0):
    policy, _ = load_model(directory)
    add_adapters(policy, CONFIG)
    randomize_adapters(policy, seed, scale=0.05)
    return policy


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_a_lora_step_equals_peft_s_on_the_transformers_model(checkpoint):
    directory, vocab = checkpoint
    policy = forge_policy(directory)
    mine = dict(policy.named_parameters())
    reference = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"), CONFIG.peft_config(adapted_modules(mine)))
    set_adapter(policy, {n: p for n, p in mine.items() if ".lora_" in n})       # its own: a no-op
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if ".lora_" in name:
                parameter.copy_(mine[name.removeprefix("base_model.model.")])
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == {n for n in mine if ".lora_" in n}
    assert trainable_parameters(policy) == sum(p.numel() for p in reference.parameters() if p.requires_grad)

    ids = torch.randint(3, vocab, (2, 12), generator=torch.Generator().manual_seed(5))
    advantages = torch.tensor([[1.0], [-0.5]])
    ours = token_logprobs(policy.logits(policy(ids)), ids)
    theirs = token_logprobs(reference(input_ids=ids).logits, ids)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    (-(ours * advantages).mean()).backward()
    (-(theirs * advantages).mean()).backward()
    grads = {n.removeprefix("base_model.model."): p.grad for n, p in reference.named_parameters() if p.requires_grad}
    for name, parameter in policy.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
            torch.testing.assert_close(parameter.grad, grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_the_merged_weights_give_the_adapted_policy_s_logits(checkpoint):
    directory, vocab = checkpoint
    policy = forge_policy(directory, seed=1)
    plain, _ = load_model(directory)
    merged = merged_state_dict(policy.state_dict(), CONFIG)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.randint(3, vocab, (2, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(plain.logits(plain(ids)), policy.logits(policy(ids)), atol=1e-5, rtol=1e-5)


def test_the_saved_adapter_loads_in_peft_with_the_merged_model_s_logits(checkpoint, tmp_path):
    directory, vocab = checkpoint
    policy = forge_policy(directory, seed=2)
    adapter = save_adapter(tmp_path / "adapter", CONFIG, policy.state_dict(), str(directory))
    base = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                             attn_implementation="eager")
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    merged_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                                     attn_implementation="eager").eval()
    merged_model.load_state_dict(merged_state_dict(policy.state_dict(), CONFIG), strict=False)
    ids = torch.randint(3, vocab, (2, 10), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, merged_model(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-5)
    # and back into a fresh policy, as a resumed learner reads it
    fresh = load_model(directory)[0]
    add_adapters(fresh, CONFIG)
    set_adapter(fresh, load_adapter(adapter))
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(value, policy.state_dict()[name], atol=0, rtol=0)


def test_no_target_and_a_foreign_adapter_are_refused(checkpoint, tmp_path):
    directory, _ = checkpoint
    with pytest.raises(ValueError, match="no linear module of the policy is named nonesuch"):
        add_adapters(load_model(directory)[0], LoraConfig(rank=2, targets=("nonesuch",)))
    policy = forge_policy(directory)
    narrower = add_adapters(load_model(directory)[0], LoraConfig(rank=4, targets=("q_proj",)))
    with pytest.raises(ValueError, match="does not fit the policy"):
        set_adapter(policy, {n: p for n, p in narrower.named_parameters() if ".lora_" in n})
    wider = {n: p for n, p in forge_policy(directory).named_parameters() if ".lora_" in n}
    wider[f"model.layers.0.self_attn.q_proj.lora_A.{ADAPTER}.weight"] = torch.zeros(8, 8)
    with pytest.raises(ValueError, match=r"lora_A\.default\.weight is"):
        set_adapter(policy, wider)


def test_the_draft_and_stacked_experts_are_never_targets():
    pattern = re.compile(target_pattern(("q_proj", "gate_proj")))
    assert pattern.fullmatch("model.layers.3.self_attn.q_proj")
    assert pattern.fullmatch("model.layers.3.mlp.shared_expert.gate_proj")
    assert not pattern.fullmatch("mtp.0.layer.self_attn.q_proj")
    assert not pattern.fullmatch("model.layers.3.mlp.experts.gate_proj")
    assert pattern.fullmatch("model.layers.3.mlp.shared_experts.gate_proj")
    assert not pattern.fullmatch("model.layers.3.self_attn.q_proj_extra")
