"""Mistral: ``[TOOL_CALLS]`` then a JSON list ``[{"name": "f", "arguments": {...}}, ...]`` (the model may add each
call's ``"id"``), or in newer tokenizers ``[TOOL_CALLS]f[ARGS]{...}`` once per call (``[CALL_ID]id`` may come
before ``[ARGS]``)."""

from __future__ import annotations

import json
import re

from forge.parsing.tools.base import (
    ToolCall,
    ToolCallParser,
    Tools,
    json_object,
    json_values,
    new_call_id,
    raw_arguments,
)

TOOL_CALLS = "[TOOL_CALLS]"
_NAMED = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\](\w+))?\[ARGS\](.*)", re.DOTALL)


class MistralToolParser(ToolCallParser):
    name = "mistral"
    start = TOOL_CALLS

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        first = text.find(TOOL_CALLS)
        if first < 0:
            return text, []
        calls: list[ToolCall] = []
        for segment in text[first + len(TOOL_CALLS):].split(TOOL_CALLS):
            more = _listed(segment) if segment.lstrip().startswith("[") else _named(segment)
            if not more:
                return text, []
            calls += more
        return text[:first], calls


def _listed(segment: str) -> list[ToolCall]:
    """The calls of a JSON list of ``{"name", "arguments"[, "id"]}`` objects, each kept as written."""
    calls = []
    for body in json_values(segment, segment.index("[") + 1, ",", "]") or ():
        call = _listed_call(body)
        if call is None:
            return []
        calls.append(call)
    return calls


def _listed_call(body: str) -> ToolCall | None:
    value = json_object(body)
    if value is None or not isinstance(value.get("name"), str) or not set(value) <= {"name", "arguments", "id"}:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        arguments = json_object(arguments)
    if not isinstance(arguments, dict):
        return None
    call_id = value.get("id")
    has_id = isinstance(call_id, str) and len(call_id) >= 9
    head = '{"name": ' + json.dumps(value["name"], ensure_ascii=False) + ', "arguments": '
    tail = (', "id": ' + json.dumps(call_id) + "}") if "id" in value else "}"
    raw = raw_arguments(body, head, tail) if list(value)[:2] == ["name", "arguments"] else None
    return ToolCall(call_id if has_id else new_call_id(), value["name"],
                    raw if raw is not None else json.dumps(arguments, ensure_ascii=False))


def _named(segment: str) -> list[ToolCall]:
    """The one call of ``name[ARGS]{...}`` (or ``name[CALL_ID]id[ARGS]{...}``)."""
    match = _NAMED.fullmatch(segment)
    if match is None:
        return []
    name, call_id, arguments = match.groups()
    if json_object(arguments) is None:
        return []
    return [ToolCall(call_id or new_call_id(), name, arguments.strip())]
