"""Llama 3.1 / 3.2 / 3.3 JSON calls: ``{"name": "f", "parameters": {...}}`` as the whole reply, several separated by
``;``, after ``<|python_tag|>`` (which may follow some content) or at the very start of the reply."""

from __future__ import annotations

from forge.parsing.tools.base import ToolCall, ToolCallParser, Tools, json_values, name_and_arguments, new_call_id

PYTHON_TAG = "<|python_tag|>"


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
    calls = []
    for value in json_values(body, 0, ";") or ():
        call = name_and_arguments(value, keys=("parameters", "arguments"))
        if call is None:
            return []
        calls.append(ToolCall(new_call_id(), *call))
    return calls
