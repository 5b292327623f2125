"""The dtype a checkpoint serves in when asked for its own (``--dtype auto``)."""

from __future__ import annotations

import json
from pathlib import Path

from forge.checkpoints.reference import ModelRef, resolve_model

__all__ = ["DTYPES", "checkpoint_dtype"]

DTYPES = ("float32", "bfloat16", "float16")


def checkpoint_dtype(reference: str | Path | ModelRef) -> str:
    """The dtype a checkpoint's config.json names, float32 where it names none of ``DTYPES``: what ``--dtype auto``
    serves."""
    data = json.loads((resolve_model(reference).directory / "config.json").read_text(encoding="utf-8"))
    named = data.get("torch_dtype") or data.get("dtype")
    return named if named in DTYPES else "float32"
