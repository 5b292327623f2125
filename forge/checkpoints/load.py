"""Loading the model a reference names: which implementation loads it (Forge's own, ``forge.model``, or
transformers'), its weights on a device in a dtype, and its tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from forge.checkpoints.builtin import builtin_model
from forge.checkpoints.dtypes import checkpoint_dtype
from forge.checkpoints.reference import ModelRef, is_native, model_type, resolve_model
from forge.model.config import SUPPORTED_MODEL_TYPES
from forge.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

    from forge.model.policy import Policy

__all__ = ["IMPLS", "check_impl", "load_model", "load_tokenizer"]

log = logging.getLogger(__name__)

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


def load_model(reference: str | Path | ModelRef, *, dtype: torch.dtype | str = "float32", device: str = "cpu",
               seed: int = 0, impl: str = "auto") -> tuple[Policy, ModelRef]:
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
