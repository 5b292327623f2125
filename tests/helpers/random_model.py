"""A random-weight checkpoint of the tiny architecture (with the built-in tokenizer) for tests of the serving
machinery, whose expectations (no early end-of-sequence, arbitrary token splits) the trained model would not meet."""

from __future__ import annotations

from pathlib import Path

from forge.builtin import write_tiny_checkpoint


def random_tiny(directory: Path, seed: int = 0) -> Path:
    return write_tiny_checkpoint(directory / "random-tiny", seed)


def random_tiny_moe(directory: Path, seed: int = 0, router_scale: float = 10.0) -> Path:
    """The tiny-moe architecture with random weights whose routers are ``router_scale`` times as confident as at
    initialisation: experts differ from token to token, and no two are near a tie that rounding could flip."""
    import torch

    from forge.builtin import write_builtin_checkpoint
    from forge.model import CausalLM

    path = write_builtin_checkpoint(directory / "random-tiny-moe", "tiny-moe", seed)
    model = CausalLM.from_pretrained(path)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.mul_(router_scale)
    model.save_pretrained(path)
    return path
