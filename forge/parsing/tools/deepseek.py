"""DeepSeek V3: ``<｜tool▁calls▁begin｜>`` then per call ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}
\\n```<｜tool▁call▁end｜>``, then ``<｜tool▁calls▁end｜>``. DeepSeek V3.1's shorter call, ``<｜tool▁call▁begin｜>f
<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, is read too."""

from __future__ import annotations

import re

from forge.parsing.tools.base import ToolCall, ToolCallParser, Tools, json_object, new_call_id, split_blocks

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_V3 = re.compile(r"(\w+)" + SEP + r"([^\n]+)\n```json\n(.*)\n```", re.DOTALL)
_V31 = re.compile(r"([^\n<]+)" + SEP + r"(.*)", re.DOTALL)


class DeepSeekV3ToolParser(ToolCallParser):
    name = "deepseek_v3"
    start = CALLS_BEGIN

    def parse(self, text: str, tools: Tools | None = None) -> tuple[str, list[ToolCall]]:
        first = text.find(CALLS_BEGIN)
        if first < 0:
            return text, []
        section = text[first + len(CALLS_BEGIN):]
        end = section.find(CALLS_END)
        if end >= 0:
            section = section[:end]
        split = split_blocks(section, CALL_BEGIN, CALL_END)
        if split is None or split[0].strip():
            return text, []
        calls = []
        for block in split[1]:
            match = _V3.fullmatch(block) or _V31.fullmatch(block)
            arguments = match.groups()[-1] if match else ""
            if match is None or json_object(arguments) is None:
                return text, []
            calls.append(ToolCall(new_call_id(), match.groups()[-2], arguments))
        return (text[:first], calls) if calls else (text, [])
