"""Completion text to an assistant message: reasoning (``<think>…</think>``), content and tool calls.

Parsers sit behind two small interfaces so other syntaxes can be added (register them in ``TOOL_PARSERS`` /
``REASONING_PARSERS``). Each has a final ``parse`` and a streaming ``visible`` that returns only what is certain to
stay, so streamed deltas always add up to the final message. The parse keeps the model's own text wherever the
chat template renders it back (tool-call arguments are the raw JSON the model wrote), so the message a client sends
back renders to exactly the sampled text and its ids can be spliced (token-in-token-out).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # a JSON object, as text

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedCompletion:
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ToolCallParser(Protocol):
    name: str

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, tool calls) of a complete text; no calls (and the text as content) if it has none."""

    def visible(self, text: str) -> str:
        """The beginning of the content that is certain whatever follows ``text``."""


class ReasoningParser(Protocol):
    name: str

    def parse(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, the rest) of a complete text."""

    def visible(self, text: str) -> tuple[str, str]:
        """(reasoning, rest) certain so far."""


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class HermesToolParser:
    """Hermes / Qwen syntax: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

    name = "hermes"
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        first = text.find(self.open_tag)
        if first < 0:
            return text, []
        calls = []
        for match in self._block.finditer(text):
            call = self._call(match.group(1))
            if call is None:
                return text, []
            calls.append(call)
        if text.count(self.open_tag) != len(calls):    # an unterminated block (e.g. cut by max_tokens)
            return text, []
        return text[:first], calls

    def visible(self, text: str) -> str:
        first = text.find(self.open_tag)
        if first >= 0:
            return text[:first]
        return text[:len(text) - held_prefix(text, self.open_tag)]

    @staticmethod
    def _call(body: str) -> ToolCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        raw = _raw_arguments(body, value["name"])
        return ToolCall(new_call_id(), value["name"], raw if raw is not None else json.dumps(arguments,
                                                                                                ensure_ascii=False))


def _raw_arguments(body: str, name: str) -> str | None:
    """The arguments exactly as written, when the block has the template's own layout (so it renders back)."""
    head = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
    if not (body.startswith(head) and body.endswith("}")):
        return None
    raw = body[len(head):-1]
    try:
        return raw if isinstance(json.loads(raw), dict) else None
    except ValueError:
        return None


class ThinkReasoningParser:
    """``<think>reasoning</think>\\ncontent`` at the start of the completion (one newline after the tag is the
    template's separator)."""

    name = "think"
    open_tag, close_tag = "<think>", "</think>"

    def parse(self, text: str) -> tuple[str | None, str]:
        if not text.startswith(self.open_tag):
            return None, text
        inner = text[len(self.open_tag):]
        end = inner.find(self.close_tag)
        if end < 0:
            return inner, ""
        rest = inner[end + len(self.close_tag):]
        return inner[:end], rest[1:] if rest.startswith("\n") else rest

    def visible(self, text: str) -> tuple[str, str]:
        if len(text) < len(self.open_tag) and self.open_tag.startswith(text):
            return "", ""
        if not text.startswith(self.open_tag):
            return "", text
        inner = text[len(self.open_tag):]
        end = inner.find(self.close_tag)
        if end < 0:
            return inner[:len(inner) - held_prefix(inner, self.close_tag)], ""
        rest = inner[end + len(self.close_tag):]
        if not rest:
            return inner[:end], ""
        return inner[:end], rest[1:] if rest.startswith("\n") else rest


TOOL_PARSERS: dict[str, type] = {"hermes": HermesToolParser}
REASONING_PARSERS: dict[str, type] = {"think": ThinkReasoningParser}


class CompletionParser:
    """Reasoning first, then tool calls in the rest; either may be absent ('none')."""

    def __init__(self, tool_parser: str = "hermes", reasoning_parser: str = "think") -> None:
        self.tools: ToolCallParser | None = None if tool_parser == "none" else TOOL_PARSERS[tool_parser]()
        self.reasoning: ReasoningParser | None = (None if reasoning_parser == "none"
                                                  else REASONING_PARSERS[reasoning_parser]())

    def parse(self, text: str, parse_tools: bool) -> ParsedCompletion:
        reasoning, rest = self.reasoning.parse(text) if self.reasoning else (None, text)
        if parse_tools and self.tools:
            content, calls = self.tools.parse(rest)
            return ParsedCompletion(content, reasoning, calls)
        return ParsedCompletion(rest, reasoning)

    def visible(self, text: str, parse_tools: bool) -> tuple[str, str]:
        """(reasoning, content) that will not change whatever is sampled next."""
        reasoning, rest = self.reasoning.visible(text) if self.reasoning else ("", text)
        if parse_tools and self.tools:
            rest = self.tools.visible(rest)
        return reasoning, rest
