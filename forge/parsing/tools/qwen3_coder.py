"""Qwen3-Coder's XML calls: ``<tool_call>\\n<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n
</tool_call>``. Values are bare text, typed by the tool's JSON schema (a string stays as written)."""

from __future__ import annotations

import re

from forge.parsing.tools.base import BlockToolParser, ToolCall, Tools
from forge.parsing.tools.parameters import only_matches, parameter_call, trim_newlines

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderToolParser(BlockToolParser):
    name = "qwen3_coder"
    start = "<tool_call>"
    end = "</tool_call>"

    def block_call(self, block: str, tools: Tools | None) -> ToolCall | None:
        function = _FUNCTION.fullmatch(block)
        parameters = only_matches(_PARAMETER, function.group(2)) if function else None
        if function is None or parameters is None:
            return None
        pairs = [(p.group(1), trim_newlines(p.group(2))) for p in parameters]
        return parameter_call(function.group(1), pairs, tools)
