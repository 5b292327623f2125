"""Random-weight models for the tests: one factory for every small random ``CausalLM`` (dense or with experts, of any
size, for any seed), a copy of a model, and random checkpoints of the built-in architectures (with the built-in
tokenizer) for tests of the serving machinery, whose expectations (no early end-of-sequence, arbitrary token
splits) the trained model would not meet."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from forge.checkpoints import write_builtin_checkpoint, write_tiny_checkpoint
from forge.model import CausalLM, ModelConfig

# A small dense shape with one MTP layer; a test names what it changes.
SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_nextn_predict_layers=1)
# Experts in every layer (unless mlp_only_layers says otherwise), two of them per token, renormalised.
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


def small_config(experts: bool = False, **fields) -> ModelConfig:
    """``SMALL``, with ``EXPERTS`` when ``experts``, and ``fields`` over both."""
    return ModelConfig(**{**SMALL, **(EXPERTS if experts else {}), **fields})


def random_model(config: ModelConfig | None = None, seed: int = 0, std: float = 0.02, *, router_scale: float = 1.0,
                 noise: float = 0.0) -> CausalLM:
    """``CausalLM(config)`` (``small_config()`` by default) in eval mode, its weights drawn from N(0, std) for
    ``seed``. ``router_scale`` multiplies the experts' routers: confident routers, whose experts differ from token to
    token and are never near a tie that rounding could flip. ``noise``: N(0, noise) added to the norms' weights and
    the biases (each drawn for ``seed``), so that a norm or a bias in the wrong place shows."""
    model = CausalLM(config or small_config())
    model.init_weights(std=std, seed=seed)
    scale_routers(model, router_scale)
    if noise:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name or name.endswith("bias"):
                    param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)) * noise)
    return model.eval()


def scale_routers(model: CausalLM, scale: float) -> None:
    """Multiply the experts' routers of ``model`` by ``scale``."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.mul_(scale)


def copy_of(model: CausalLM) -> CausalLM:
    """Another model with ``model``'s config and weights (an engine samples from one while a learner trains the
    other)."""
    copy = CausalLM(model.config)
    copy.load_state_dict(model.state_dict())
    return copy


def random_tiny(directory: Path, seed: int = 0, context: int | None = None, layers: int | None = None) -> Path:
    """The tiny architecture with random weights; ``context`` raises its positions (RoPE unchanged), so that a
    stream may run far longer than a client takes to act on it; ``layers`` keeps only that many layers (with their
    weights), where a test's cost is attention over a very long prompt, not the model's depth."""
    path = write_tiny_checkpoint(directory / "random-tiny", seed)
    if context is None and layers is None:
        return path
    config = json.loads((path / "config.json").read_text())
    if context is not None:
        config["max_position_embeddings"] = context
    if layers is not None:
        model = CausalLM.from_pretrained(path)
        kept = ModelConfig.from_hf_dict({**config, "num_hidden_layers": layers})
        shallow = CausalLM(kept)
        shallow.load_state_dict({name: weight for name, weight in model.state_dict().items()
                                 if name in shallow.state_dict()})
        shallow.save_pretrained(path)
        config = {**json.loads((path / "config.json").read_text()), **config, "num_hidden_layers": layers}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def random_tiny_moe(directory: Path, seed: int = 0, router_scale: float = 10.0) -> Path:
    """The tiny-moe architecture with random weights whose routers are ``router_scale`` times as confident as at
    initialisation (see ``random_model``)."""
    path = write_builtin_checkpoint(directory / "random-tiny-moe", "tiny-moe", seed)
    model = CausalLM.from_pretrained(path)
    scale_routers(model, router_scale)
    model.save_pretrained(path)
    return path


def perturbed_tiny(directory: Path, scale: float = 0.5, seed: int = 0) -> Path:
    """The built-in tiny model (its tokenizer too) with every weight moved by ``scale`` of its tensor's standard
    deviation of noise: another model of the same tokenizer, e.g. a teacher to distil from."""
    from forge.checkpoints import TINY_DIR

    model = CausalLM.from_pretrained(TINY_DIR)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * scale)
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (directory / name).write_bytes((TINY_DIR / name).read_bytes())
    return directory
