"""LoRA adapters as training leaves them: random A and B (B starts at zero, where an adapter changes nothing and its
A gets no gradient), drawn for a seed."""

from __future__ import annotations

import torch


def randomize_adapters(model: torch.nn.Module, seed: int, scale: float = 0.1) -> torch.nn.Module:
    """Give every adapter weight of ``model`` N(0, scale²) values drawn for ``seed``; returns ``model``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return model


def adapted_run(base, seed: int, config=None):
    """A run's adapters on ``base`` (random, for ``seed``): its adapter version (what its learner publishes with
    ``lora_publish = "adapters"``) and its merged model (what it samples from)."""
    from forge.learner.lora import LoraConfig, adapter_version, add_adapters, merged_state_dict

    from helpers.random_model import copy_of

    config = config or LoraConfig(rank=4, alpha=8.0, publish="adapters")
    adapted = randomize_adapters(add_adapters(copy_of(base), config), seed)
    merged = copy_of(base)
    merged.load_state_dict(merged_state_dict(adapted.state_dict(), config))
    return adapter_version(adapted.state_dict(), config), merged
