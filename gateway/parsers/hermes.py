"""Hermes / Qwen 2.5 / Qwen 3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

from __future__ import annotations

from forge.gateway.parsers.base import ToolCall, ToolCallParser, Tools, name_and_arguments, new_call_id, split_blocks


class HermesToolParser(ToolCallParser):
    name = "hermes"
    start = "<tool_call>"

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        split = split_blocks(text, self.start, "</tool_call>")
        if split is None:
            return text, []
        content, blocks = split
        calls = []
        for block in blocks:
            call = name_and_arguments(block)
            if call is None:
                return text, []
            calls.append(ToolCall(new_call_id(), *call))
        return (content, calls) if calls else (text, [])
