"""Kimi K2: ``<|tool_calls_section_begin|>`` then per call ``<|tool_call_begin|>functions.f:0
<|tool_call_argument_begin|>{...}<|tool_call_end|>``, then ``<|tool_calls_section_end|>``. The call's id is the
model's own ``functions.f:0``, which the chat template writes back."""

from __future__ import annotations

import re

from forge.parsing.tools.base import ToolCall, ToolCallParser, Tools, json_object, split_blocks

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END, ARGUMENTS = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
_CALL = re.compile(r"\s*([^<\s]+:\d+)\s*" + re.escape(ARGUMENTS) + r"(.*)", re.DOTALL)


class KimiK2ToolParser(ToolCallParser):
    name = "kimi_k2"
    start = SECTION_BEGIN

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        first = text.find(SECTION_BEGIN)
        if first < 0:
            return text, []
        section = text[first + len(SECTION_BEGIN):]
        end = section.find(SECTION_END)
        if end >= 0:
            section = section[:end]
        split = split_blocks(section, CALL_BEGIN, CALL_END)
        if split is None or split[0].strip():
            return text, []
        calls = []
        for block in split[1]:
            match = _CALL.fullmatch(block)
            if match is None or json_object(match.group(2)) is None:
                return text, []
            call_id, arguments = match.groups()
            calls.append(ToolCall(call_id, call_id.rsplit(":", 1)[0].split(".", 1)[-1], arguments))
        return (text[:first], calls) if calls else (text, [])
