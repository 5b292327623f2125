"""The built-in models (``tiny``, ``tiny-moe``): their architectures, fresh inits of them (deterministic for a seed),
their tokenizer, and complete checkpoints written from them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forge.assets import TOKENIZER_FILES
from forge.checkpoints import reference
from forge.checkpoints.reference import BUILTIN_MODELS, ModelNotFound, builtin_dir
from forge.tokenizer import Tokenizer

if TYPE_CHECKING:
    from forge.model import CausalLM
    from forge.model.config import ModelConfig

__all__ = ["builtin_model", "tiny_config", "tiny_model", "tiny_tokenizer", "write_builtin_checkpoint",
           "write_tiny_checkpoint"]


def tiny_config(name: str = "tiny") -> ModelConfig:
    """The architecture of the built-in model ``name`` (``tiny`` or ``tiny-moe``)."""
    from forge.model import ModelConfig

    return ModelConfig.from_file(builtin_dir(name))


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(reference.TINY_DIR)


def builtin_model(name: str = "tiny", seed: int = 0) -> CausalLM:
    """The architecture of the built-in model ``name``, freshly initialised (deterministic for a seed)."""
    from forge.model import CausalLM

    if name not in BUILTIN_MODELS:
        raise ModelNotFound(name, f"not a built-in model (built in: {', '.join(BUILTIN_MODELS)})")
    model = CausalLM(tiny_config(name))
    model.init_weights(seed=seed)
    return model


def tiny_model(seed: int = 0) -> CausalLM:
    """The tiny architecture, freshly initialised (deterministic for a seed)."""
    return builtin_model("tiny", seed)


def write_builtin_checkpoint(directory: str | Path, name: str = "tiny", seed: int = 0) -> Path:
    """A complete HF-layout checkpoint of the built-in architecture ``name`` (random weights) with its tokenizer
    files."""
    directory = Path(directory)
    builtin_model(name, seed).save_pretrained(directory)
    for file in TOKENIZER_FILES:
        (directory / file).write_bytes((reference.TINY_DIR / file).read_bytes())
    return directory


def write_tiny_checkpoint(directory: str | Path, seed: int = 0) -> Path:
    """``write_builtin_checkpoint`` of the tiny model."""
    return write_builtin_checkpoint(directory, "tiny", seed)
