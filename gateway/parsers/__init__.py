"""Tool-call parsers, one module per model family's syntax, and ``TOOL_PARSERS``, the registry ``--tool-parser``
picks from (``auto``: ``pick_tool_parser`` reads the model's chat template)."""

from __future__ import annotations

from forge.gateway.parsers.auto import pick_tool_parser
from forge.gateway.parsers.base import ToolCall, ToolCallParser, held_prefix, new_call_id
from forge.gateway.parsers.deepseek import DeepSeekV3ToolParser
from forge.gateway.parsers.glm import Glm45ToolParser
from forge.gateway.parsers.hermes import HermesToolParser
from forge.gateway.parsers.kimi import KimiK2ToolParser
from forge.gateway.parsers.llama3 import Llama3JsonToolParser
from forge.gateway.parsers.minimax import MiniMaxM2ToolParser
from forge.gateway.parsers.mistral import MistralToolParser
from forge.gateway.parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolCallParser]] = {parser.name: parser for parser in (
    HermesToolParser, Llama3JsonToolParser, MistralToolParser, Qwen3CoderToolParser, DeepSeekV3ToolParser,
    Glm45ToolParser, KimiK2ToolParser, MiniMaxM2ToolParser)}

__all__ = ["TOOL_PARSERS", "DeepSeekV3ToolParser", "Glm45ToolParser", "HermesToolParser", "KimiK2ToolParser",
           "Llama3JsonToolParser", "MiniMaxM2ToolParser", "MistralToolParser", "Qwen3CoderToolParser", "ToolCall",
           "ToolCallParser", "held_prefix", "new_call_id", "pick_tool_parser"]
