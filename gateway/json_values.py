"""The bounds of a request's JSON, checked once, right after it is decoded and before anything else reads it: every
endpoint's body (HTTP) and every JSON text a gRPC message carries (tool parameters, template variables).

- **Depth.** Values nest at most ``MAX_JSON_DEPTH`` levels. Decoding alone accepts about a thousand, but everything
  after it that recurses (pickling to the decoding process, the chat template, encoding an answer or a record) would
  then fail with a ``RecursionError`` somewhere: here it is a 400 naming the place, before any of it.
- **Count.** At most ``MAX_JSON_VALUES`` values: the work after decoding is linear in it.
- **Text.** No string or key holds a lone surrogate (no UTF-8 form: neither the tokenizer nor protobuf take it).

The walk is iterative (any depth that decoded can be walked) and keeps the path of each value as a link to its
parent's, so a body of a million values is checked without building a million path strings."""

from __future__ import annotations

import re
from typing import Any

from forge.gateway.errors import BadRequest

MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 1_000_000
SURROGATE = re.compile("[\ud800-\udfff]")

Path = tuple[Any, str | int] | None           # (the parent's path, this key or index); None at the root


def has_surrogate(text: str) -> bool:
    """A lone UTF-16 surrogate (JSON "\\ud800", or an undecodable header byte): no UTF-8 form, so neither the
    tokenizer nor a protobuf string can take it."""
    return not text.isascii() and SURROGATE.search(text) is not None


def _shown(path: Path, root: str) -> str:
    """``messages[0].content`` for the path of that value; ``root`` for the root itself."""
    parts: list[str | int] = []
    while path is not None:
        path, key = path
        parts.append(key)
    text = ""
    for key in reversed(parts):
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text or root


def check_json(value: Any, root: str = "body") -> None:
    """BadRequest unless decoded JSON ``value`` keeps the bounds; errors name the place (``root`` for the whole)."""
    stack: list[tuple[Any, int, Path]] = [(value, 0, None)]
    count = 0
    while stack:
        item, depth, path = stack.pop()
        count += 1
        if count > MAX_JSON_VALUES:
            raise BadRequest(f"{root} holds more than {MAX_JSON_VALUES} JSON values", root)
        if isinstance(item, str):
            if has_surrogate(item):
                where = _shown(path, root)
                raise BadRequest(f"{where} contains a lone surrogate (not valid Unicode text)", where)
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                where = _shown(path, root)
                raise BadRequest(f"{where} is nested deeper than {MAX_JSON_DEPTH} levels, the most a request may "
                                 "nest", where)
            if isinstance(item, list):
                stack.extend((child, depth + 1, (path, i)) for i, child in enumerate(item))
                continue
            for key, child in item.items():
                if has_surrogate(str(key)):
                    where = _shown(path, root)
                    raise BadRequest(f"{where} contains a lone surrogate (not valid Unicode text)", where)
                stack.append((child, depth + 1, (path, str(key))))
