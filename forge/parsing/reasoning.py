"""Reasoning syntaxes: the thinking a model writes before its answer, between an opening and a closing tag
(``<think>…</think>`` for Qwen3, DeepSeek-R1, GLM-4.5, MiniMax M2 and most others; ``[THINK]…[/THINK]`` for
Mistral's Magistral), and ``--reasoning-parser auto``, which reads the tags from the chat template.

Some templates open the block themselves: their generation prompt ends with ``<think>`` (DeepSeek-R1-0528,
Qwen3's thinking models, MiniMax M2), so the completion begins inside the reasoning and carries only the closing
tag. ``opened_by`` finds such a prompt's open block; the gateway parses its tag together with the completion, so
the reasoning is split off the same way whichever side wrote the tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from forge.parsing.tools import held_prefix


class TaggedReasoningParser:
    """``OPEN reasoning CLOSE\\ncontent`` at the start of a completion (one newline after the closing tag is the
    template's separator). ``parse`` splits a complete text; ``visible`` what is certain so far, so streamed deltas
    add up to the final split."""

    name: ClassVar[str]
    open_tag: ClassVar[str]
    close_tag: ClassVar[str]

    def parse(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, the rest) of a complete text."""
        if not text.startswith(self.open_tag):
            return None, text
        inner = text[len(self.open_tag):]
        end = inner.find(self.close_tag)
        if end < 0:
            return inner, ""
        rest = inner[end + len(self.close_tag):]
        return inner[:end], rest[1:] if rest.startswith("\n") else rest

    def visible(self, text: str) -> tuple[str, str]:
        """(reasoning, rest) certain so far."""
        if len(text) < len(self.open_tag) and self.open_tag.startswith(text):
            return "", ""
        if not text.startswith(self.open_tag):
            return "", text
        inner = text[len(self.open_tag):]
        end = inner.find(self.close_tag)
        if end < 0:
            return inner[:len(inner) - held_prefix(inner, self.close_tag)], ""
        rest = inner[end + len(self.close_tag):]
        if not rest:
            return inner[:end], ""
        return inner[:end], rest[1:] if rest.startswith("\n") else rest

    def opened_by(self, prompt: str) -> str:
        """The opening tag when ``prompt`` ends inside a reasoning block it opened (nothing but whitespace after the
        tag), else ''. The whitespace is the template's: the reasoning is what the model writes after it."""
        start = prompt.rfind(self.open_tag)
        if start < 0 or prompt[start + len(self.open_tag):].strip():
            return ""
        return self.open_tag


class ThinkReasoningParser(TaggedReasoningParser):
    name = "think"
    open_tag, close_tag = "<think>", "</think>"


class MistralReasoningParser(TaggedReasoningParser):
    name = "mistral"
    open_tag, close_tag = "[THINK]", "[/THINK]"


REASONING_PARSERS: dict[str, type[TaggedReasoningParser]] = {
    parser.name: parser for parser in (ThinkReasoningParser, MistralReasoningParser)}


def pick_reasoning_parser(template: str | Mapping[str, str] | None) -> tuple[str, str]:
    """(parser name or 'none', why) for a model with chat ``template`` (or several, by name): the tags the template
    writes."""
    texts = list(template.values()) if isinstance(template, Mapping) else [template or ""]
    for name in ("mistral", "think"):           # [THINK] templates may mention <think> in prose, not the reverse
        tag = REASONING_PARSERS[name].open_tag
        if any(tag in text for text in texts):
            return name, f"the chat template writes {tag}"
    return "none", "the chat template writes no reasoning tags"


__all__ = ["REASONING_PARSERS", "MistralReasoningParser", "TaggedReasoningParser", "ThinkReasoningParser",
           "pick_reasoning_parser"]
