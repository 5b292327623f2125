"""DeepSeek V3: ``<｜tool▁calls▁begin｜>`` then per call ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}
\\n```<｜tool▁call▁end｜>``, then ``<｜tool▁calls▁end｜>``. DeepSeek V3.1's shorter call, ``<｜tool▁call▁begin｜>f
<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, is read too."""

from __future__ import annotations

import re

from forge.parsing.tools.base import SectionToolParser, ToolCall, Tools, json_object, new_call_id

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_V3 = re.compile(r"(\w+)" + SEP + r"([^\n]+)\n```json\n(.*)\n```", re.DOTALL)
_V31 = re.compile(r"([^\n<]+)" + SEP + r"(.*)", re.DOTALL)


class DeepSeekV3ToolParser(SectionToolParser):
    name = "deepseek_v3"
    start, end = CALLS_BEGIN, CALLS_END
    call_start, call_end = CALL_BEGIN, CALL_END

    def block_call(self, block: str, tools: Tools | None) -> ToolCall | None:
        match = _V3.fullmatch(block) or _V31.fullmatch(block)
        if match is None or json_object(match.groups()[-1]) is None:
            return None
        return ToolCall(new_call_id(), match.groups()[-2], match.groups()[-1])
