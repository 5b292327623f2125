"""MiniMax-M2: ``<minimax:tool_call>`` blocks of ``<invoke name="f"><parameter name="p">v</parameter></invoke>``
(one or more invokes each). Values are bare text, typed by the tool's JSON schema (a string stays as written)."""

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

_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


class MiniMaxM2ToolParser(BlockToolParser):
    name = "minimax_m2"
    start = "<minimax:tool_call>"
    end = "</minimax:tool_call>"

    def block_calls(self, block: str, tools: Tools | None) -> list[ToolCall]:
        return _invokes(block, tools)


def _invokes(block: str, tools: Tools | None) -> list[ToolCall]:
    calls, at = [], 0
    for invoke in _INVOKE.finditer(block):
        if block[at:invoke.start()].strip():
            return []
        name, body = invoke.groups()
        pairs = [(p.group(1), _value(p.group(2))) for p in _PARAMETER.finditer(body)]
        if _PARAMETER.sub("", body).strip():
            return []
        calls.append(ToolCall(new_call_id(), name, typed_arguments(pairs, parameter_schemas(tools, name))))
        at = invoke.end()
    return [] if block[at:].strip() else calls


def _value(text: str) -> str:
    """The value without the newline the template puts on each side of a multi-line one."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text
