"""The output head's LoRA adapter on families that run through transformers (``SharedBase`` replaces their
``logits``): checked against an independent computation, transformers' own model with the adapter merged into a
head of its own (W + s·B·A, s = alpha / rank), so its logits keep each family's own post-processing (Gemma 2's
soft-capping on a tied head, Granite's logits scaling); the head's A and B get the gradients of that computation;
with no adapter active (or the adapter removed) the logits are the base's, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from forge.learner.tinker.adapters import HEAD, LORA_ALPHA, SharedBase
from forge.learner.tinker.types import LoraSpec

from helpers.families import SMALL, write_family

RANK = 4
CASES = {"llama": {}, "gemma2": {}, "granite": {"logits_scaling": 4.0}}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    family = request.param
    directory = tmp_path_factory.mktemp(family)
    if family == "granite":
        torch.manual_seed(5)
        config = transformers.GraniteConfig(**SMALL, **CASES[family])
        transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(directory)
    else:
        write_family(directory, family, seed=5)
    return family, directory


def _head_model(directory: Path, delta: torch.Tensor) -> torch.nn.Module:
    """transformers' model of ``directory`` with ``delta`` added to a head of its own (untied from the
    embeddings)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    weight = model.get_output_embeddings().weight.detach().clone()
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight = torch.nn.Parameter(weight + delta)
    model.lm_head = head
    return model


def _with_head_adapter(directory: Path, seed: int = 3) -> tuple[SharedBase, torch.Tensor, torch.Tensor]:
    """A base with model 'm' (the head's adapter only), its B set to random values (a fresh B is zero)."""
    base = SharedBase(str(directory))
    base.add("m", LoraSpec(rank=RANK, seed=seed, train_attn=False, train_mlp=False, train_unembed=True))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        base.head_b["m"].copy_(torch.randn(base.head_b["m"].shape, generator=generator) * 0.5)
    return base, base.head_a["m"], base.head_b["m"]


def test_the_head_adapter_equals_transformers_with_it_merged(checkpoint) -> None:
    family, directory = checkpoint
    base, a, b = _with_head_adapter(directory)
    assert set(base.parameters("m")) == {f"{HEAD}.lora_A.weight", f"{HEAD}.lora_B.weight"}
    ids = torch.randint(3, SMALL["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    base.activate("m")
    with torch.no_grad():
        ours = base.policy.logits(base.policy(ids))
        merged = _head_model(directory, (LORA_ALPHA / RANK) * b @ a)(input_ids=ids).logits
    assert torch.allclose(ours, merged, atol=1e-5, rtol=1e-4), (family, (ours - merged).abs().max())
    with torch.no_grad():
        plain = _head_model(directory, torch.zeros_like(b @ a))(input_ids=ids).logits
    assert (ours - plain).abs().max() > 1e-2                 # the adapter does change the logits


def test_the_head_adapters_gradients_are_those_of_the_merged_head(checkpoint) -> None:
    family, directory = checkpoint
    base, a, b = _with_head_adapter(directory, seed=4)
    ids = torch.randint(3, SMALL["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(2))
    targets = torch.randint(3, SMALL["vocab_size"], (7,), generator=torch.Generator().manual_seed(3))
    base.activate("m")
    loss = torch.nn.functional.cross_entropy(base.policy.logits(base.policy(ids))[0], targets)
    loss.backward()
    leaf_a, leaf_b = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    model.requires_grad_(False)
    weight = model.get_output_embeddings().weight.detach().clone()
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    expected = torch.nn.functional.cross_entropy(
        _post_process(model.config, hidden @ (weight + (LORA_ALPHA / RANK) * leaf_b @ leaf_a).T)[0], targets)
    expected.backward()
    assert torch.allclose(loss, expected, atol=1e-5)
    assert torch.allclose(a.grad, leaf_a.grad, atol=1e-6, rtol=1e-4), family
    assert torch.allclose(b.grad, leaf_b.grad, atol=1e-6, rtol=1e-4), family


def _post_process(config, logits: torch.Tensor) -> torch.Tensor:
    """What the family's transformers model does to its head's product, written out."""
    if getattr(config, "logits_scaling", None):
        logits = logits / config.logits_scaling
    if getattr(config, "final_logit_softcapping", None):
        logits = torch.tanh(logits / config.final_logit_softcapping) * config.final_logit_softcapping
    return logits


def test_without_the_adapter_the_logits_are_the_bases(checkpoint) -> None:
    _, directory = checkpoint
    base, _, _ = _with_head_adapter(directory)
    ids = torch.randint(3, SMALL["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()(
            input_ids=ids).logits
        base.activate(None)
        unadapted = base.policy.logits(base.policy(ids))
        base.remove("m")
        removed = base.policy.logits(base.policy(ids))
    assert torch.allclose(unadapted, plain, atol=1e-5, rtol=1e-4)
    assert torch.equal(unadapted, removed)
    assert "m" not in base.head_a and "m" not in base.head_b
