"""MiniMax-M2: ``<minimax:tool_call>`` blocks of ``<invoke name="f"><parameter name="p">v</parameter></invoke>``
(one or more invokes each). Values are bare text, typed by the tool's JSON schema (a string stays as written)."""

from __future__ import annotations

import re

from forge.parsing.tools.base import BlockToolParser, ToolCall, Tools
from forge.parsing.tools.parameters import only_matches, parameter_call, trim_newlines

_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


class MiniMaxM2ToolParser(BlockToolParser):
    name = "minimax_m2"
    start = "<minimax:tool_call>"
    end = "</minimax:tool_call>"

    def block_calls(self, block: str, tools: Tools | None) -> list[ToolCall]:
        calls = []
        for invoke in only_matches(_INVOKE, block) or ():
            parameters = only_matches(_PARAMETER, invoke.group(2))
            if parameters is None:
                return []
            pairs = [(p.group(1), trim_newlines(p.group(2))) for p in parameters]
            calls.append(parameter_call(invoke.group(1), pairs, tools))
        return calls
