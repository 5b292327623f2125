"""Hermes / Qwen 2.5 / Qwen 3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

from __future__ import annotations

from forge.parsing.tools.base import BlockToolParser, ToolCall, Tools, name_and_arguments, new_call_id


class HermesToolParser(BlockToolParser):
    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"

    def block_call(self, block: str, tools: Tools | None) -> ToolCall | None:
        call = name_and_arguments(block)
        return None if call is None else ToolCall(new_call_id(), *call)
