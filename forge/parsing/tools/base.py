"""What every tool-call parser shares: the call it yields, its interface, and the helpers the syntaxes have in common
(holding back a marker that may still be arriving, keeping the arguments' own text, typing a value by its schema).

A parser reads the part of a completion after the reasoning. Its final ``parse`` returns the content and the calls,
or the whole text as content (and no calls) when a call is malformed or unfinished: it never raises on what a model
writes. Its streaming ``visible`` returns the beginning of the content that no continuation can change, so the
content streamed adds up to the final one; calls go out once the completion is complete.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

Tools = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # a JSON object, as text

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ToolCallParser(ABC):
    """One model family's tool-call syntax. ``start`` opens the calls; the content is what comes before it."""

    name: ClassVar[str]
    start: ClassVar[str]

    @abstractmethod
    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        """(content, tool calls) of a complete text; no calls (and the text as content) if it has none, or if one of
        them is malformed or unfinished. ``tools`` (the request's) type the values of untyped syntaxes."""

    def visible(self, text: str) -> str:
        """The beginning of the content that is certain whatever follows ``text``."""
        first = text.find(self.start)
        if first >= 0:
            return text[:first]
        return text[:len(text) - held_prefix(text, self.start)]


class BlockToolParser(ToolCallParser):
    """A syntax whose calls come in ``start…end`` blocks: the content is what comes before the first block, and a
    block that holds no well-formed call makes the whole text content."""

    end: ClassVar[str]

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        split = split_blocks(text, self.start, self.end)
        if split is None:
            return text, []
        content, blocks = split
        calls: list[ToolCall] = []
        for block in blocks:
            found = self.block_calls(block, tools)
            if not found:
                return text, []
            calls += found
        return (content, calls) if calls else (text, [])

    @abstractmethod
    def block_calls(self, block: str, tools: Tools | None) -> list[ToolCall]:
        """The calls one block holds (none: it is malformed)."""


def split_blocks(text: str, open_tag: str, close_tag: str) -> tuple[str, list[str]] | None:
    """(content, the inner text of each ``open_tag…close_tag`` block) of ``text``: the content is what comes before
    the first block, text between and after blocks is dropped; None when a block is unfinished."""
    first = text.find(open_tag)
    if first < 0:
        return text, []
    at, blocks = first, []
    while at >= 0:
        end = text.find(close_tag, at + len(open_tag))
        if end < 0:
            return None
        blocks.append(text[at + len(open_tag):end])
        at = text.find(open_tag, end + len(close_tag))
    return text[:first], blocks


def json_object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):         # text the model wrote: nested past decoding's depth is not JSON
        return None
    return value if isinstance(value, dict) else None


def raw_arguments(body: str, head: str, tail: str) -> str | None:
    """The arguments exactly as written between ``head`` and ``tail`` (the template's own layout, so they render
    back), or None when ``body`` has another layout."""
    if not (body.startswith(head) and body.endswith(tail) and len(body) >= len(head) + len(tail)):
        return None
    raw = body[len(head):len(body) - len(tail)]
    return raw if json_object(raw) is not None else None


def name_and_arguments(body: str, keys: Iterable[str] = ("arguments",)) -> tuple[str, str] | None:
    """(name, arguments text) of a ``{"name": ..., "arguments": {...}}`` object (the arguments key is the first of
    ``keys`` present; as an object or a string holding one): the arguments' own text when the object is laid out as
    ``{"name": "n", "<key>": {...}}``, else the object re-serialised."""
    value = json_object(body)
    if value is None or not isinstance(value.get("name"), str):
        return None
    key = next((k for k in keys if k in value), None)
    arguments = value.get(key, {}) if key else {}
    if isinstance(arguments, str):
        arguments = json_object(arguments)
    if not isinstance(arguments, dict):
        return None
    name = value["name"]
    if key is not None and list(value) == ["name", key]:
        raw = raw_arguments(body.strip(), '{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{key}": ', "}")
        if raw is not None:
            return name, raw
    return name, json.dumps(arguments, ensure_ascii=False)


def parameter_schemas(tools: Tools | None, name: str) -> Mapping[str, Any]:
    """The JSON schemas of the parameters of function ``name`` among ``tools`` (empty if it is not there)."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            return properties if isinstance(properties, Mapping) else {}
    return {}


_INTEGER = re.compile(r"-?\d+")


def _types(schema: Any) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [k for option in schema[key] for k in _types(option)]
    return []


def typed_value(text: str, schema: Any) -> Any:
    """A parameter value written as bare text, as the type its JSON schema gives it (the first type it parses as);
    the text itself when it has no schema, is a string, or parses as none of its types."""
    for kind in _types(schema):
        if kind == "string":
            return text
        if kind == "integer" and _INTEGER.fullmatch(text.strip()):
            return int(text)
        if kind == "boolean" and text.strip() in ("true", "false"):
            return text.strip() == "true"
        if kind == "null" and text.strip() == "null":
            return None
        if kind in ("number", "object", "array"):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                continue
            wanted = {"number": (int, float), "object": (dict,), "array": (list,)}[kind]
            if isinstance(value, wanted) and not isinstance(value, bool):
                return value
    return text


def typed_arguments(pairs: Iterable[tuple[str, str]], schemas: Mapping[str, Any]) -> str:
    """The arguments of a call written as (name, bare text) pairs, as a JSON object typed by ``schemas``."""
    return json.dumps({key: typed_value(value, schemas.get(key)) for key, value in pairs}, ensure_ascii=False)
