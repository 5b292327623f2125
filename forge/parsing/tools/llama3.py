"""Llama 3.1 / 3.2 / 3.3 JSON calls: ``{"name": "f", "parameters": {...}}`` as the whole reply, several separated by
``;``, after ``<|python_tag|>`` (which may follow some content) or at the very start of the reply."""

from __future__ import annotations

import json

from forge.parsing.tools.base import ToolCall, ToolCallParser, Tools, name_and_arguments, new_call_id

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser(ToolCallParser):
    name = "llama3_json"
    start = PYTHON_TAG

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        tag = text.find(PYTHON_TAG)
        if tag >= 0:
            content, body = text[:tag], text[tag + len(PYTHON_TAG):]
        elif text.startswith("{"):
            content, body = "", text
        else:
            return text, []
        calls = _calls(body)
        return (content, calls) if calls else (text, [])

    def visible(self, text: str) -> str:
        if text.startswith("{"):        # the reply may be a call: nothing is certain until it ends
            return ""
        return super().visible(text)


def _calls(body: str) -> list[ToolCall]:
    """The ``;``-separated objects of ``body``, or none if anything else is there."""
    calls, at = [], 0
    while True:
        at = len(body) - len(body[at:].lstrip())
        try:
            _, end = _DECODER.raw_decode(body, at)
        except (ValueError, RecursionError):     # nested past decoding's depth: not JSON
            return []
        call = name_and_arguments(body[at:end], keys=("parameters", "arguments"))
        if call is None:
            return []
        calls.append(ToolCall(new_call_id(), *call))
        rest = body[end:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return []
        at = len(body) - len(rest) + 1
