"""Checkpoints as every command sees them: what a model reference names (``reference``: ``tiny``, ``tiny-moe``, a
checkpoint directory in the Hugging Face layout or a Hugging Face model id), a Hub model's fetch into the Hugging Face
cache and its lookup there (``hub``), the dtype a checkpoint serves in (``dtypes``), which implementation
loads it and the loading of its model and tokenizer (``load``), and the built-in models' architectures, fresh inits
and checkpoints written from them (``builtin``). ``resolve_model`` is the one rule of a reference and
``ModelNotFound`` its one error."""

from forge.checkpoints.builtin import (
    builtin_model,
    tiny_config,
    tiny_model,
    tiny_tokenizer,
    write_builtin_checkpoint,
    write_tiny_checkpoint,
)
from forge.checkpoints.dtypes import DTYPES, checkpoint_dtype
from forge.checkpoints.hub import HubError, HubId, fetch_snapshot, parse_hub_id
from forge.checkpoints.load import IMPLS, check_impl, load_model, load_tokenizer
from forge.checkpoints.reference import (
    BUILTIN_MODELS,
    TINY_DIR,
    TINY_MOE_DIR,
    TINY_MOE_NAME,
    TINY_NAME,
    ModelNotFound,
    ModelRef,
    cached_model,
    hub_id_of,
    is_builtin,
    is_native,
    model_type,
    resolve_model,
    trainable_model,
)

__all__ = [
    "BUILTIN_MODELS",
    "DTYPES",
    "IMPLS",
    "TINY_DIR",
    "TINY_MOE_DIR",
    "TINY_MOE_NAME",
    "TINY_NAME",
    "HubError",
    "HubId",
    "ModelNotFound",
    "ModelRef",
    "builtin_model",
    "cached_model",
    "check_impl",
    "checkpoint_dtype",
    "fetch_snapshot",
    "hub_id_of",
    "is_builtin",
    "is_native",
    "load_model",
    "load_tokenizer",
    "model_type",
    "parse_hub_id",
    "resolve_model",
    "tiny_config",
    "tiny_model",
    "tiny_tokenizer",
    "trainable_model",
    "write_builtin_checkpoint",
    "write_tiny_checkpoint",
]
