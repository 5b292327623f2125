"""The built-in tiny model: what ``--model tiny`` means everywhere (tokenizer, chat template, architecture)."""

from __future__ import annotations

from pathlib import Path

from forge.assets import TINY_DIR, TINY_NAME
from forge.model import CausalLM, ModelConfig
from forge.tokenizer import Tokenizer

__all__ = ["TINY_DIR", "TINY_NAME", "is_builtin", "resolve_model_dir", "tiny_config", "tiny_model", "tiny_tokenizer"]


def is_builtin(name: str | Path) -> bool:
    return str(name) in ("tiny", TINY_NAME)


def tiny_config() -> ModelConfig:
    return ModelConfig.from_file(TINY_DIR)


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(TINY_DIR)


def tiny_model(seed: int = 0) -> CausalLM:
    """The tiny architecture, freshly initialised (deterministic for a seed)."""
    model = CausalLM(tiny_config())
    model.init_weights(seed=seed)
    return model


def write_tiny_checkpoint(directory: str | Path, seed: int = 0) -> Path:
    """A complete HF-layout checkpoint of the tiny architecture (random weights) with its tokenizer files."""
    directory = Path(directory)
    tiny_model(seed).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (directory / name).write_bytes((TINY_DIR / name).read_bytes())
    return directory


def resolve_model_dir(name: str | Path) -> Path:
    """A checkpoint directory for a model argument: a path, or ``tiny`` for the built-in model's directory."""
    path = TINY_DIR if is_builtin(name) else Path(name)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
    return path
