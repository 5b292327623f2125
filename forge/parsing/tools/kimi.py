"""Kimi K2: ``<|tool_calls_section_begin|>`` then per call ``<|tool_call_begin|>functions.f:0
<|tool_call_argument_begin|>{...}<|tool_call_end|>``, then ``<|tool_calls_section_end|>``. The call's id is the
model's own ``functions.f:0``, which the chat template writes back."""

from __future__ import annotations

import re

from forge.parsing.tools.base import SectionToolParser, ToolCall, Tools, json_object

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END, ARGUMENTS = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
_CALL = re.compile(r"\s*([^<\s]+:\d+)\s*" + re.escape(ARGUMENTS) + r"(.*)", re.DOTALL)


class KimiK2ToolParser(SectionToolParser):
    name = "kimi_k2"
    start, end = SECTION_BEGIN, SECTION_END
    call_start, call_end = CALL_BEGIN, CALL_END

    def block_call(self, block: str, tools: Tools | None) -> ToolCall | None:
        match = _CALL.fullmatch(block)
        if match is None or json_object(match.group(2)) is None:
            return None
        call_id, arguments = match.groups()
        return ToolCall(call_id, call_id.rsplit(":", 1)[0].split(".", 1)[-1], arguments)
