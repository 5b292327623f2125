"""Tool-call parsers, one module per model family's syntax, and ``TOOL_PARSERS``, the registry ``--tool-parser``
picks from (``auto``: ``pick_tool_parser`` reads the model's chat template)."""

from __future__ import annotations

from forge.parsing.tools.auto import pick_tool_parser
from forge.parsing.tools.base import ToolCall, ToolCallParser, held_prefix, new_call_id
from forge.parsing.tools.deepseek import DeepSeekV3ToolParser
from forge.parsing.tools.glm import Glm45ToolParser
from forge.parsing.tools.hermes import HermesToolParser
from forge.parsing.tools.kimi import KimiK2ToolParser
from forge.parsing.tools.llama3 import Llama3JsonToolParser
from forge.parsing.tools.minimax import MiniMaxM2ToolParser
from forge.parsing.tools.mistral import MistralToolParser
from forge.parsing.tools.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolCallParser]] = {parser.name: parser for parser in (
    HermesToolParser, Llama3JsonToolParser, MistralToolParser, Qwen3CoderToolParser, DeepSeekV3ToolParser,
    Glm45ToolParser, KimiK2ToolParser, MiniMaxM2ToolParser)}

__all__ = ["TOOL_PARSERS", "DeepSeekV3ToolParser", "Glm45ToolParser", "HermesToolParser", "KimiK2ToolParser",
           "Llama3JsonToolParser", "MiniMaxM2ToolParser", "MistralToolParser", "Qwen3CoderToolParser", "ToolCall",
           "ToolCallParser", "held_prefix", "new_call_id", "pick_tool_parser"]
