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
