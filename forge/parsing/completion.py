"""Completion text to an assistant message: reasoning (``<think>…</think>``), content and tool calls.

Parsers sit behind two small interfaces so other syntaxes can be added: tool-call syntaxes, one per model family, in
``forge.parsing.tools`` (``TOOL_PARSERS``), reasoning syntaxes in ``forge.parsing.reasoning``
(``REASONING_PARSERS``). Each has a final ``parse`` and a streaming ``visible`` that returns only what is certain to
stay, so streamed deltas always add up to the final message. The parse keeps the model's own text wherever the
chat template renders it back (tool-call arguments are the raw JSON the model wrote), so the message a client sends
back renders to exactly the sampled text and its ids can be spliced (token-in-token-out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forge.parsing.reasoning import REASONING_PARSERS, TaggedReasoningParser, ThinkReasoningParser
from forge.parsing.tools import (
    TOOL_PARSERS,
    HermesToolParser,
    ToolCall,
    ToolCallParser,
    held_prefix,
    new_call_id,
    pick_tool_parser,
)
from forge.parsing.tools.base import Tools

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "CompletionParser", "HermesToolParser", "ParsedCompletion",
           "TaggedReasoningParser", "ThinkReasoningParser", "ToolCall", "ToolCallParser", "held_prefix", "new_call_id",
           "pick_tool_parser"]


@dataclass
class ParsedCompletion:
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


class CompletionParser:
    """Reasoning first, then tool calls in the rest; either may be absent ('none')."""

    def __init__(self, tool_parser: str = "hermes", reasoning_parser: str = "think") -> None:
        self.tools: ToolCallParser | None = None if tool_parser == "none" else TOOL_PARSERS[tool_parser]()
        self.reasoning: TaggedReasoningParser | None = (None if reasoning_parser == "none"
                                                        else REASONING_PARSERS[reasoning_parser]())

    def opened_reasoning(self, prompt: str) -> str:
        """The opening tag of a reasoning block ``prompt`` leaves open for the completion ('' if none): parse it
        together with the completion."""
        return self.reasoning.opened_by(prompt) if self.reasoning else ""

    def parse(self, text: str, parse_tools: bool, tools: Tools | None = None) -> ParsedCompletion:
        """``tools`` (the request's) type the arguments of syntaxes that write them as bare text."""
        reasoning, rest = self.reasoning.parse(text) if self.reasoning else (None, text)
        if parse_tools and self.tools:
            content, calls = self.tools.parse(rest, tools)
            return ParsedCompletion(content, reasoning, calls)
        return ParsedCompletion(rest, reasoning)

    def visible(self, text: str, parse_tools: bool) -> tuple[str, str]:
        """(reasoning, content) that will not change whatever is sampled next."""
        reasoning, rest = self.reasoning.visible(text) if self.reasoning else ("", text)
        if parse_tools and self.tools:
            rest = self.tools.visible(rest)
        return reasoning, rest
