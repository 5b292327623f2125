"""Settings as plain JSON: nested objects of numbers, strings and lists, paths as strings, secrets masked, no
Python reprs. One function for the run summary and for the trackers' record of a run's settings."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from forge.settings import SETTING, is_settings

MASK = "***"


def settings_json(settings: Any) -> dict[str, Any]:
    """A settings dataclass's options and groups by field name (internal fields left out), secrets masked."""
    found: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        spec = f.metadata.get(SETTING)
        if is_settings(type(value)):
            found[f.name] = settings_json(value)
        elif spec is not None:
            found[f.name] = MASK if spec.secret and value not in (None, ()) else plain(value)
    return found


def plain(value: Any) -> Any:
    """``value`` as JSON holds it: settings and other dataclasses as objects, mappings with text keys, sequences as
    lists, paths as text, a non-finite float as None, a class by its dotted name; anything else as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if is_settings(type(value)):
        return settings_json(value)
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return str(value)


def flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as one level of dotted keys (``learner.trainer.lr``), lists kept as values."""
    found: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            found.update(flat(value, f"{name}."))
        else:
            found[name] = value
    return found
