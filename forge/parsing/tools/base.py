"""What every tool-call parser shares: the call it yields, its interface, the block and section layouts most syntaxes
write their calls in, and the JSON helpers (holding back a marker that may still be arriving, decoding a run of JSON
values, keeping the arguments' own text). Values written as bare text are in ``forge.parsing.tools.parameters``.

A parser reads the part of a completion after the reasoning. Its final ``parse`` returns the content and the calls,
or the whole text as content (and no calls) when a call is malformed or unfinished: it never raises on what a model
writes. Its streaming ``visible`` returns the beginning of the content that no continuation can change, so the
content streamed adds up to the final one; calls go out once the completion is complete.
"""

from __future__ import annotations

import json
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
    block that holds no well-formed call makes the whole text content. A syntax with one call per block writes
    ``block_call``, one with several ``block_calls``."""

    end: ClassVar[str]

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        split = self.blocks(text)
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

    def blocks(self, text: str) -> tuple[str, list[str]] | None:
        """(content, the inner text of each block) of ``text``; None when it is malformed."""
        return split_blocks(text, self.start, self.end)

    def block_calls(self, block: str, tools: Tools | None) -> list[ToolCall]:
        """The calls one block holds (none: it is malformed)."""
        call = self.block_call(block, tools)
        return [] if call is None else [call]

    def block_call(self, block: str, tools: Tools | None) -> ToolCall | None:
        """The one call a block holds (None: it is malformed)."""
        raise NotImplementedError(f"{type(self).__name__} reads neither block_calls nor block_call")


class SectionToolParser(BlockToolParser):
    """A syntax whose calls come in one ``start…end`` section (a model may leave out its ``end``), each call a
    ``call_start…call_end`` block, with nothing but whitespace before the first: the content is what comes before
    the section."""

    call_start: ClassVar[str]
    call_end: ClassVar[str]

    def blocks(self, text: str) -> tuple[str, list[str]] | None:
        first = text.find(self.start)
        if first < 0:
            return text, []
        section = text[first + len(self.start):]
        end = section.find(self.end)
        if end >= 0:
            section = section[:end]
        split = split_blocks(section, self.call_start, self.call_end)
        if split is None or split[0].strip():
            return None
        return text[:first], split[1]


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


_DECODER = json.JSONDecoder()


def json_values(text: str, at: int, separator: str, close: str = "") -> list[str] | None:
    """The texts of the JSON values ``text`` holds from ``at`` on, ``separator`` between them, then ``close`` and
    nothing else (whitespace may come around each); None when anything else is there, or when there are none."""
    values = []
    while True:
        at = len(text) - len(text[at:].lstrip())
        try:
            _, end = _DECODER.raw_decode(text, at)
        except (ValueError, RecursionError):     # nested past decoding's depth: not JSON
            return None
        values.append(text[at:end])
        rest = text[end:].lstrip()
        if rest.startswith(close) and not rest[len(close):].strip():
            return values
        if not rest.startswith(separator):
            return None
        at = len(text) - len(rest) + len(separator)


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
