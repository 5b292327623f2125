"""GLM-4.5 / 4.6: ``<tool_call>f\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n...</tool_call>``. Values are
bare text, typed by the tool's JSON schema (a string stays as written)."""

from __future__ import annotations

import re

from forge.parsing.tools.base import BlockToolParser, ToolCall, Tools
from forge.parsing.tools.parameters import only_matches, parameter_call

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm45ToolParser(BlockToolParser):
    name = "glm45"
    start = "<tool_call>"
    end = "</tool_call>"

    def block_call(self, block: str, tools: Tools | None) -> ToolCall | None:
        head, _, _ = block.partition("<arg_key>")
        name = head.strip()
        pairs = only_matches(_PAIR, block[len(head):])
        if not name or "<" in name or "\n" in name or pairs is None:
            return None
        return parameter_call(name, [(p.group(1).strip(), p.group(2)) for p in pairs], tools)
