"""Chat completions' ``messages`` read into the template's form (``forge.gateway.messages.chat_message``), each bad
field named in the error: text content or text parts, tool calls on assistant messages, tool results, reasoning."""

from __future__ import annotations

from typing import Any

from forge.gateway.errors import BadRequest
from forge.gateway.messages import chat_message, plain_message

PLAIN_MESSAGE_KEYS = frozenset({"role", "content"})


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.content[{i}]: only text parts are supported", f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _tool_calls(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list):
        raise BadRequest(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    calls = []
    for i, call in enumerate(value):
        here = f"{where}.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{here} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': "
                             "...}}", here)
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str | dict):
            raise BadRequest(f"{here}.function.arguments must be a JSON string", here)
        calls.append({"id": call.get("id") if isinstance(call.get("id"), str) else "", "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return calls


def parse_messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise BadRequest("messages must be a non-empty list", "messages")
    messages = []
    for i, raw in enumerate(value):
        plain = plain_message(raw.get("role"), raw.get("content")) \
            if type(raw) is dict and raw.keys() <= PLAIN_MESSAGE_KEYS else None
        messages.append(plain or parse_message(raw, f"messages[{i}]"))
    return messages


def parse_message(raw: Any, where: str) -> dict:
    """One chat-completions message, checked, in the template's form."""
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be an object", where)
    role = raw.get("role")
    if not isinstance(role, str):
        raise BadRequest(f"{where}.role must be a string (got {role!r})", f"{where}.role")
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    tool_calls = _tool_calls(raw["tool_calls"], where) if raw.get("tool_calls") else None
    return chat_message(where, role, _content(raw.get("content"), where), tool_calls,
                        {name: raw[name] for name in ("tool_call_id", "name") if isinstance(raw.get(name), str)},
                        reasoning if isinstance(reasoning, str) else None)
