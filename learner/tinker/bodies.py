"""JSON request bodies checked field by field before any work: a ``Body`` reads one typed field at a time and
refuses a wrong type, a value out of bounds or a missing field with a 400 naming the field. Booleans are never
numbers, numbers are finite, text is bounded. Names of checkpoints and ``tinker://`` paths are checked here too: a
safe character set, no traversal, and a path names one of three kinds of checkpoint of one model."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from forge.learner.tinker.errors import bad_request

MAX_TEXT = 512
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,159}")
PATH_KINDS = {"weights": "training", "sampler_weights": "sampler"}
SCHEME = "tinker://"


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"the body is not JSON: {exc}") from None


class Body:
    def __init__(self, data: Any, where: str = "body") -> None:
        if not isinstance(data, dict):
            raise bad_request(f"{where} must be a JSON object")
        self.data = data
        self.where = where

    def _get(self, key: str, required: bool) -> Any:
        value = self.data.get(key)
        if value is None and required:
            raise bad_request(f"{self._name(key)} is required")
        return value

    def _name(self, key: str) -> str:
        return key if self.where == "body" else f"{self.where}.{key}"

    def text(self, key: str, required: bool = True, max_len: int = MAX_TEXT) -> str | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, str) or not value or len(value) > max_len:
            raise bad_request(f"{self._name(key)} must be non-empty text of at most {max_len} characters")
        return value

    def integer(self, key: str, required: bool = False, default: int | None = None, low: int | None = None,
                high: int | None = None) -> int | None:
        value = self._get(key, required)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"{self._name(key)} must be an integer")
        if (low is not None and value < low) or (high is not None and value > high):
            raise bad_request(f"{self._name(key)} must be in [{low}, {high}], not {value}")
        return value

    def number(self, key: str, default: float, low: float | None = None, high: float | None = None,
               high_open: bool = False) -> float:
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad_request(f"{self._name(key)} must be a finite number")
        too_high = high is not None and (value >= high if high_open else value > high)
        if (low is not None and value < low) or too_high:
            raise bad_request(f"{self._name(key)} = {value} is out of range")
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{self._name(key)} must be true or false")
        return value

    def child(self, key: str, required: bool = False) -> Body | None:
        value = self._get(key, required)
        return None if value is None else Body(value, self._name(key))

    def items(self, key: str, max_items: int) -> list[Any]:
        value = self._get(key, False)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise bad_request(f"{self._name(key)} must be a list of at most {max_items} items")
        return value


def check_name(name: str, what: str = "checkpoint name") -> str:
    if not NAME.fullmatch(name) or ".." in name:
        raise bad_request(f"{what} {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
                          "digit")
    return name


def check_model_id(model_id: Any) -> str:
    if not isinstance(model_id, str) or not MODEL_ID.fullmatch(model_id) or ".." in model_id:
        raise bad_request(f"{model_id!r} is not a model id")
    return model_id


@dataclass(frozen=True)
class TinkerPath:
    """``tinker://MODEL_ID/KIND/NAME``: KIND ``weights`` (training state) or ``sampler_weights``."""

    model_id: str
    kind: str
    name: str

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def checkpoint_type(self) -> str:
        return PATH_KINDS[self.kind]

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"


def parse_path(path: Any, kinds: tuple[str, ...] = tuple(PATH_KINDS)) -> TinkerPath:
    if not isinstance(path, str) or not path.startswith(SCHEME) or len(path) > MAX_TEXT:
        raise bad_request(f"{path!r} is not a tinker:// path")
    parts = path[len(SCHEME):].split("/")
    if len(parts) != 3:
        raise bad_request(f"{path!r} is not tinker://MODEL_ID/KIND/NAME")
    model_id, kind, name = parts
    if kind not in kinds:
        raise bad_request(f"{path!r}: the kind must be {' or '.join(kinds)}, not {kind!r}")
    return TinkerPath(check_model_id(model_id), kind, check_name(name))
