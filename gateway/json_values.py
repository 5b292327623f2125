"""The bounds of a request's JSON, checked once, right after it is decoded and before anything else reads it: every
endpoint's body (HTTP) and every JSON text a gRPC message carries (tool parameters, template variables).

- **Depth.** Values nest at most ``MAX_JSON_DEPTH`` levels. Decoding alone accepts about a thousand, but everything
  after it that recurses (pickling to the decoding process, the chat template, encoding an answer or a record) would
  then fail with a ``RecursionError`` somewhere: here it is a 400 naming the place, before any of it.
- **Count.** At most ``MAX_JSON_VALUES`` values: the work after decoding is linear in it.
- **Text.** No string or key holds a lone surrogate (no UTF-8 form: neither the tokenizer nor protobuf take it).

The walks are iterative (any depth that decoded can be walked). The first keeps no paths; only a value with a problem
is walked again, keeping each value's path as a link to its parent's, to name the place. A body decoded from text
that holds no lone surrogate's escape or bytes skips the string checks (``may_hold_surrogates``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from forge.gateway.errors import BadRequest

MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 1_000_000
SURROGATE = re.compile("[\ud800-\udfff]")
CONTAINERS = (dict, list)
SURROGATE_STARTS = (b"\\ud", b"\\uD", b"\xed")   # of a lone surrogate's JSON escape and of its UTF-8 bytes

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


def _surrogate_in(path: Path, root: str) -> BadRequest:
    where = _shown(path, root)
    return BadRequest(f"{where} contains a lone surrogate (not valid Unicode text)", where)


def check_json(value: Any, root: str = "body", strings: bool = True) -> None:
    """BadRequest unless decoded JSON ``value`` keeps the bounds; errors name the place (``root`` for the whole).
    ``strings``: look for lone surrogates too (False where the caller knows the text it decoded had none: see
    ``may_hold_surrogates``)."""
    if _may_break_bounds(value, strings):
        _name_the_problem(value, root, strings)


def _may_break_bounds(value: Any, strings: bool) -> bool:
    """Whether ``value`` may break a bound: a walk level by level that keeps no paths, so that only a value with a
    problem is walked again, keeping them, to name its place."""
    if not isinstance(value, CONTAINERS):
        return strings and isinstance(value, str) and has_surrogate(value)
    level: list[dict | list] = [value]
    depth, count = 0, 1
    while level:
        if depth >= MAX_JSON_DEPTH:
            return True
        below: list[dict | list] = []
        for item in level:
            count += len(item)
            if isinstance(item, list):
                children: Iterable[Any] = item
            else:
                children = item.values()
                if strings:
                    for key in item:
                        if has_surrogate(key if isinstance(key, str) else str(key)):
                            return True
            for child in children:
                if isinstance(child, CONTAINERS):
                    below.append(child)
                elif strings and isinstance(child, str) and has_surrogate(child):
                    return True
        if count > MAX_JSON_VALUES:
            return True
        level, depth = below, depth + 1
    return False


def _name_the_problem(value: Any, root: str, strings: bool) -> None:
    """The BadRequest naming the first problem a depth-first walk meets (none raised when there is none)."""
    if not isinstance(value, CONTAINERS):
        if strings and isinstance(value, str) and has_surrogate(value):
            raise _surrogate_in(None, root)
        return
    stack: list[tuple[dict | list, int, Path]] = [(value, 0, None)]
    count = 1
    while stack:
        item, depth, path = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            where = _shown(path, root)
            raise BadRequest(f"{where} is nested deeper than {MAX_JSON_DEPTH} levels, the most a request may nest",
                             where)
        count += len(item)
        if count > MAX_JSON_VALUES:
            raise BadRequest(f"{root} holds more than {MAX_JSON_VALUES} JSON values", root)
        is_list = isinstance(item, list)
        for key, child in enumerate(item) if is_list else item.items():
            if not is_list:
                key = str(key)
                if strings and has_surrogate(key):
                    raise _surrogate_in(path, root)
            if isinstance(child, CONTAINERS):
                stack.append((child, depth + 1, (path, key)))
            elif strings and isinstance(child, str) and has_surrogate(child):
                raise _surrogate_in((path, key), root)


def may_hold_surrogates(raw: bytes | bytearray) -> bool:
    """Whether JSON text ``raw`` can decode to a string holding a lone surrogate: only a ``\\uD800``-``\\uDFFF``
    escape or such a code point's UTF-8 bytes (which ``json.loads`` lets through) give one, and each begins with one
    of these (a cheap search; Hangul and other text near them gives a false alarm, never a miss)."""
    return any(start in raw for start in SURROGATE_STARTS)
