"""What ``--model tiny`` means everywhere, and how every command resolves a model reference.

A model reference is a built-in model, ``tiny`` (or its id ``forge-tiny``, shipped in forge/assets/tiny) or
``tiny-moe`` (``forge-tiny-moe``, its mixture-of-experts variant), or a checkpoint directory in the Hugging Face
layout (a config.json, safetensors weights, the tokenizer files).
``resolve_model`` is the one rule and ``ModelNotFound`` its one error; callers report that error their own way
(a usage error in a CLI) with its message unchanged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forge.assets import TINY_DIR, TINY_MOE_DIR, TINY_MOE_NAME, TINY_NAME, TOKENIZER_FILES
from forge.model.config import SUPPORTED_MODEL_TYPES
from forge.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

    from forge.model import CausalLM
    from forge.model.config import ModelConfig

__all__ = [
    "BUILTIN_MODELS",
    "IMPLS",
    "TINY_DIR",
    "TINY_MOE_DIR",
    "TINY_MOE_NAME",
    "TINY_NAME",
    "ModelNotFound",
    "ModelRef",
    "builtin_model",
    "check_impl",
    "checkpoint_dtype",
    "is_builtin",
    "load_model",
    "load_tokenizer",
    "resolve_model",
    "tiny_config",
    "tiny_model",
    "tiny_tokenizer",
    "write_builtin_checkpoint",
    "write_tiny_checkpoint",
]

log = logging.getLogger(__name__)

BUILTIN_MODELS = {"tiny": TINY_NAME, "tiny-moe": TINY_MOE_NAME}     # name -> the id it serves under
BUILTIN_NAMES = (*BUILTIN_MODELS, *BUILTIN_MODELS.values())


class ModelNotFound(ValueError):
    """A model reference that is neither a built-in model nor a checkpoint directory of a supported model."""

    def __init__(self, reference: str | Path, reason: str | None = None) -> None:
        self.reference = reference
        self.reason = reason
        super().__init__(f"{reference}: {reason}" if reason else
                         f"{reference} is neither a built-in model ('tiny', 'tiny-moe') nor a checkpoint "
                         f"directory (no config.json in it)")

    def __reduce__(self) -> tuple[type[ModelNotFound], tuple[str | Path, str | None]]:
        return type(self), (self.reference, self.reason)        # the default would rebuild it from the message


@dataclass(frozen=True)
class ModelRef:
    """A resolved model reference."""

    reference: str | Path       # as given
    directory: Path             # absolute; its asset directory for a built-in model
    model_id: str               # what the model serves under (KV salts, stats): TINY_NAME, … or the directory
    builtin: bool

    @property
    def has_weights(self) -> bool:
        return any(self.directory.glob("*.safetensors"))

    @property
    def builtin_name(self) -> str | None:
        """``tiny`` or ``tiny-moe`` for a built-in model, else None."""
        return next((name for name, id_ in BUILTIN_MODELS.items() if id_ == self.model_id), None) \
            if self.builtin else None


def is_builtin(reference: str | Path) -> bool:
    return str(reference) in BUILTIN_NAMES


def _builtin_dir(name: str) -> Path:
    return TINY_DIR if name == "tiny" else TINY_MOE_DIR      # module globals, read when asked (tests move them)


def resolve_model(reference: str | Path | ModelRef) -> ModelRef:
    """The model ``reference`` names: ``tiny``/``forge-tiny`` or a checkpoint directory (one with a config.json
    naming a supported model_type); raises ModelNotFound otherwise. A ModelRef is returned as it is. Nothing but
    config.json is read."""
    if isinstance(reference, ModelRef):
        return reference
    if is_builtin(reference):
        name = next(n for n, id_ in BUILTIN_MODELS.items() if str(reference) in (n, id_))
        return ModelRef(reference, _builtin_dir(name), BUILTIN_MODELS[name], builtin=True)
    directory = Path(reference)
    if not (directory / "config.json").is_file():
        raise ModelNotFound(reference)
    check_model_type(reference, directory / "config.json")
    directory = directory.resolve()
    return ModelRef(reference, directory, str(directory), builtin=False)


def check_model_type(reference: str | Path, config_file: Path) -> None:
    """ModelNotFound unless ``config_file`` is JSON naming a model_type: found before anything loads (whether a
    component can run that family is its own check: ``is_native``, ``trainable_model``)."""
    if not isinstance(read_model_type(reference, config_file), str):
        raise ModelNotFound(reference, "its config.json names no model_type")


def read_model_type(reference: str | Path, config_file: Path) -> object:
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelNotFound(reference, f"cannot read its config.json: {exc}") from exc
    return data.get("model_type") if isinstance(data, dict) else None


def model_type(reference: str | Path | ModelRef) -> str:
    """The model_type of the model ``reference`` names (ModelNotFound for a bad reference)."""
    ref = resolve_model(reference)
    return str(read_model_type(ref.reference, ref.directory / "config.json"))


def is_native(reference: str | Path | ModelRef) -> bool:
    """Whether Forge implements the family itself (``forge.model``: the torch engine, MTP, experts, tree attention);
    the others train through transformers."""
    return model_type(reference) in SUPPORTED_MODEL_TYPES


IMPLS = ("auto", "native", "transformers")      # which implementation trains a model: see check_impl


def check_impl(reference: str | Path | ModelRef, impl: str) -> None:
    """ValueError unless ``impl`` can load the model: ``native`` is Forge's own (qwen3, qwen3_moe: the torch engine,
    MTP, experts), ``transformers`` any family transformers implements, ``auto`` native where it exists."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, not {impl!r}")
    if impl == "native" and not is_native(reference):
        raise ValueError(f"Forge has no native implementation of {model_type(reference)!r} (it implements "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}): use impl auto or transformers")
    ref = resolve_model(reference)
    if impl == "transformers" and ref.builtin and not ref.has_weights:
        raise ValueError(f"the built-in {ref.builtin_name} model has no checkpoint in this installation for "
                         "transformers to load: use impl auto or native")


def trainable_model(reference: str) -> ModelRef:
    """``resolve_model``, and ModelNotFound unless the checkpoint has weights and Forge or transformers implements
    its family (a setting's check)."""
    ref = resolve_model(reference)
    kind = model_type(ref)
    if kind not in SUPPORTED_MODEL_TYPES:
        from transformers import CONFIG_MAPPING

        if kind not in CONFIG_MAPPING:
            raise ModelNotFound(reference, f"model_type {kind!r} in its config.json is implemented neither by Forge "
                                           f"({', '.join(SUPPORTED_MODEL_TYPES)}) nor by the installed transformers")
    if not ref.builtin and not ref.has_weights:
        raise ModelNotFound(reference, "it holds no weights (*.safetensors)")
    return ref


DTYPES = ("float32", "bfloat16", "float16")


def checkpoint_dtype(reference: str | Path | ModelRef) -> str:
    """The dtype a checkpoint's config.json names, float32 where it names none of ``DTYPES``: what ``--dtype auto``
    serves."""
    data = json.loads((resolve_model(reference).directory / "config.json").read_text(encoding="utf-8"))
    named = data.get("torch_dtype") or data.get("dtype")
    return named if named in DTYPES else "float32"


def load_model(reference: str | Path | ModelRef, *, dtype: torch.dtype | str = "float32", device: str = "cpu",
               seed: int = 0, impl: str = "auto") -> tuple[CausalLM, ModelRef]:
    """The model ``reference`` names with its weights, on ``device`` in ``dtype`` (a torch dtype, its name, or
    ``auto``: the checkpoint's own, see ``checkpoint_dtype``).
    The built-in model without shipped weights is a fresh init from ``seed`` (with a warning). A family Forge does
    not implement loads through transformers (``forge.model.transformers_policy``), as any family does with
    ``impl="transformers"`` (see ``check_impl``). Raises ModelNotFound for a bad reference, ValueError
    (CheckpointError, ModelConfigError) for a bad checkpoint or an impl that cannot load it."""
    import torch

    from forge.model import CausalLM
    from forge.model.transformers_policy import TransformersCausalLM

    ref = resolve_model(reference)
    check_impl(ref, impl)
    if dtype == "auto":
        dtype = checkpoint_dtype(reference)
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if ref.builtin and not ref.has_weights:
        log.warning("the built-in %s model has no trained weights in this installation: using a fresh init",
                    ref.builtin_name)
        return builtin_model(ref.builtin_name or "tiny", seed).to(device=device, dtype=torch_dtype), ref
    if impl == "transformers" or not is_native(ref):
        return TransformersCausalLM.from_pretrained(ref.directory, dtype=torch_dtype, device=device), ref
    return CausalLM.from_pretrained(ref.directory, dtype=torch_dtype, device=device), ref


def load_tokenizer(reference: str | Path | ModelRef) -> Tokenizer:
    """The tokenizer (and chat template) of the model ``reference`` names; raises ModelNotFound for a bad
    reference, TokenizerError (a ValueError) for a checkpoint without a usable tokenizer.json."""
    return Tokenizer.from_dir(resolve_model(reference).directory)


def tiny_config(name: str = "tiny") -> ModelConfig:
    """The architecture of the built-in model ``name`` (``tiny`` or ``tiny-moe``)."""
    from forge.model import ModelConfig

    return ModelConfig.from_file(_builtin_dir(name))


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(TINY_DIR)


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
        (directory / file).write_bytes((TINY_DIR / file).read_bytes())
    return directory


def write_tiny_checkpoint(directory: str | Path, seed: int = 0) -> Path:
    """``write_builtin_checkpoint`` of the tiny model."""
    return write_builtin_checkpoint(directory, "tiny", seed)
