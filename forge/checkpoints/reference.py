"""What ``--model tiny`` means everywhere, and how every command resolves a model reference.

A model reference is a built-in model, ``tiny`` (or its id ``forge-tiny``, shipped in forge/assets/tiny) or
``tiny-moe`` (``forge-tiny-moe``, its mixture-of-experts variant), a checkpoint directory in the Hugging Face
layout (a config.json, safetensors weights, the tokenizer files), or a model on the Hugging Face Hub named by its id,
``org/name`` or ``org/name@revision`` (``forge.checkpoints.hub``; a directory of that name wins).
``resolve_model`` is the one rule and ``ModelNotFound`` its one error; callers report that error their own way
(a usage error in a CLI) with its message unchanged. Only config.json is read here: nothing loads. A Hub model is
never fetched here: resolving its id reads nothing, and its directory is its snapshot in the Hugging Face cache,
looked up on first use (``cached_model`` looks it up at once: what a service checks its setting with).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from forge.assets import TINY_DIR, TINY_MOE_DIR, TINY_MOE_NAME, TINY_NAME
from forge.checkpoints.hub import HubError, HubId, cached_snapshot, parse_hub_id
from forge.model.config import SUPPORTED_MODEL_TYPES

BUILTIN_MODELS = {"tiny": TINY_NAME, "tiny-moe": TINY_MOE_NAME}     # name -> the id it serves under
BUILTIN_NAMES = (*BUILTIN_MODELS, *BUILTIN_MODELS.values())


class ModelNotFound(ValueError):
    """A model reference that is neither a built-in model, a checkpoint directory of a supported model nor a Hub
    model in the Hugging Face cache."""

    def __init__(self, reference: str | Path, reason: str | None = None) -> None:
        self.reference = reference
        self.reason = reason
        super().__init__(f"{reference}: {reason}" if reason else
                         f"{reference} is neither a built-in model ('tiny', 'tiny-moe'), a checkpoint directory (no "
                         f"config.json in it) nor a Hugging Face model id (org/name or org/name@revision)")

    def __reduce__(self) -> tuple[type[ModelNotFound], tuple[str | Path, str | None]]:
        return type(self), (self.reference, self.reason)        # the default would rebuild it from the message


@dataclass(frozen=True)
class ModelRef:
    """A resolved model reference."""

    reference: str | Path       # as given
    location: Path | HubId      # the directory (absolute; its asset directory for a built-in model), or the Hub id
    model_id: str               # what the model serves under (KV salts, stats): TINY_NAME, …, the directory or the id
    builtin: bool

    @cached_property
    def directory(self) -> Path:
        """Where its files are: a Hub model's snapshot in the Hugging Face cache, looked up (never fetched) on first
        use, ModelNotFound naming ``forge model fetch`` when it is not there."""
        if isinstance(self.location, Path):
            return self.location
        try:
            return cached_snapshot(self.location)
        except HubError as exc:
            raise ModelNotFound(self.reference, exc.reason) from None

    @property
    def hub(self) -> HubId | None:
        """The Hub id of a Hub model, else None."""
        return self.location if isinstance(self.location, HubId) else None

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


def builtin_dir(name: str) -> Path:
    """The asset directory of the built-in model ``name``: this module's globals, read when asked (tests move
    them)."""
    return TINY_DIR if name == "tiny" else TINY_MOE_DIR


def hub_id_of(reference: str | Path) -> HubId | None:
    """The Hub id ``reference`` names, None for a built-in model or a path (an existing directory of the same name
    wins over an id). Nothing but the existence of that path is looked up."""
    if not isinstance(reference, str) or is_builtin(reference) or Path(reference).exists():
        return None
    return parse_hub_id(reference)


def resolve_model(reference: str | Path | ModelRef) -> ModelRef:
    """The model ``reference`` names: ``tiny``/``forge-tiny``, a checkpoint directory (one with a config.json
    naming a supported model_type) or a Hub id (``org/name[@revision]``, its syntax alone checked: its directory is
    looked up in the cache when first used); raises ModelNotFound otherwise. A ModelRef is returned as it is.
    Nothing but config.json is read."""
    if isinstance(reference, ModelRef):
        return reference
    if is_builtin(reference):
        name = next(n for n, id_ in BUILTIN_MODELS.items() if str(reference) in (n, id_))
        return ModelRef(reference, builtin_dir(name), BUILTIN_MODELS[name], builtin=True)
    hub = hub_id_of(reference)
    if hub is not None:
        return ModelRef(reference, hub, str(hub), builtin=False)
    directory = Path(reference)
    if not (directory / "config.json").is_file():
        raise ModelNotFound(reference)
    check_model_type(reference, directory / "config.json")
    directory = directory.resolve()
    return ModelRef(reference, directory, str(directory), builtin=False)


def cached_model(reference: str | Path | ModelRef) -> ModelRef:
    """``resolve_model``, with a Hub model's snapshot found in the Hugging Face cache at once (never fetched) and its
    config.json checked as a directory's is: what a service checks its model setting with. ModelNotFound, naming
    ``forge model fetch``, for a Hub model not in the cache."""
    ref = resolve_model(reference)
    if ref.hub is not None:
        check_model_type(ref.reference, ref.directory / "config.json")
    return ref


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


def trainable_model(reference: str) -> ModelRef:
    """``cached_model``, and ModelNotFound unless the checkpoint has weights and Forge or transformers implements
    its family (a setting's check)."""
    ref = cached_model(reference)
    kind = model_type(ref)
    if kind not in SUPPORTED_MODEL_TYPES:
        from transformers import CONFIG_MAPPING

        if kind not in CONFIG_MAPPING:
            raise ModelNotFound(reference, f"model_type {kind!r} in its config.json is implemented neither by Forge "
                                           f"({', '.join(SUPPORTED_MODEL_TYPES)}) nor by the installed transformers")
    if not ref.builtin and not ref.has_weights:
        raise ModelNotFound(reference, "it holds no weights (*.safetensors)")
    return ref
