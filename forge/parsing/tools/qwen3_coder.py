"""Qwen3-Coder's XML calls: ``<tool_call>\\n<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n
</tool_call>``. Values are bare text, typed by the tool's JSON schema (a string stays as written)."""

from __future__ import annotations

import re

from forge.parsing.tools.base import (
    BlockToolParser,
    ToolCall,
    Tools,
    new_call_id,
    parameter_schemas,
    typed_arguments,
)

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderToolParser(BlockToolParser):
    name = "qwen3_coder"
    start = "<tool_call>"
    end = "</tool_call>"

    def block_calls(self, block: str, tools: Tools | None) -> list[ToolCall]:
        call = _call(block, tools)
        return [] if call is None else [call]


def _call(block: str, tools: Tools | None) -> ToolCall | None:
    match = _FUNCTION.fullmatch(block)
    if match is None:
        return None
    name, body = match.group(1), match.group(2)
    pairs, at = [], 0
    for parameter in _PARAMETER.finditer(body):
        if body[at:parameter.start()].strip():
            return None
        pairs.append((parameter.group(1), _value(parameter.group(2))))
        at = parameter.end()
    if body[at:].strip():
        return None
    return ToolCall(new_call_id(), name, typed_arguments(pairs, parameter_schemas(tools, name)))


def _value(text: str) -> str:
    """The value without the newline the syntax puts on each side of it."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text
