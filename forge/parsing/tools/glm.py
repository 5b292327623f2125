"""GLM-4.5 / 4.6: ``<tool_call>f\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n...</tool_call>``. Values are
bare text, typed by the tool's JSON schema (a string stays as written)."""

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

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm45ToolParser(BlockToolParser):
    name = "glm45"
    start = "<tool_call>"
    end = "</tool_call>"

    def block_calls(self, block: str, tools: Tools | None) -> list[ToolCall]:
        call = _call(block, tools)
        return [] if call is None else [call]


def _call(block: str, tools: Tools | None) -> ToolCall | None:
    head, _, _ = block.partition("<arg_key>")
    name = head.strip()
    if not name or "<" in name or "\n" in name:
        return None
    body = block[len(head):]
    pairs, at = [], 0
    for pair in _PAIR.finditer(body):
        if body[at:pair.start()].strip():
            return None
        pairs.append((pair.group(1).strip(), pair.group(2)))
        at = pair.end()
    if body[at:].strip():
        return None
    return ToolCall(new_call_id(), name, typed_arguments(pairs, parameter_schemas(tools, name)))
