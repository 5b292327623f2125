"""Grammars for tool calls as the model's chat template writes them: strict functions' arguments held to their JSON
schemas, and a JSON reply (``response_format``) that may still call a tool.

The layout of a call is read from the template, as the forced-call opener is (``forced_calls``): an assistant turn
holding a probe call is rendered, and the text around the probe's name and arguments is the template's: what comes
before the name, between it and the arguments, and after them up to the end of the turn. The grammar spells that
text out (the template's special tokens as ``<[id]>``, the rest as literals), each function's arguments as its JSON
schema (``strict``) or any JSON object, and ends where the end-of-sequence token may come. It goes to the actor
as ``Grammar("lark", ...)``, the learner replays it, and what is sampled parses as the tool call it spells.

With ``tool_choice`` auto and no ``response_format`` the reply stays free (it may be text, or reason in special
tokens a grammar would have to foresee): strict arguments are then the model's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from forge.gateway.errors import BadRequest
from forge.gateway.forced_calls import PROBE_ARGUMENTS, probe_turn, tool_names
from forge.sampling.grammar import ANY_OBJECT, json_lark
from forge.v1 import common_pb2


@dataclass(frozen=True)
class CallLayout:
    """One tool call as the template writes it: ``before`` + the name + ``between`` + the arguments + ``after``."""

    before: str
    between: str
    after: str
    quoted_name: bool          # the name is written as a JSON string


def call_layout(render: Callable[..., str], messages: list[dict], prompt: str, tools: list[dict],
                end_texts: tuple[str, ...]) -> CallLayout:
    """The template's layout of a tool call after ``messages`` (``prompt``: them rendered with the generation
    prompt); ``end_texts`` are the end-of-sequence tokens' texts, where the turn's text stops."""
    name = tool_names(tools)[0]
    unreadable = BadRequest("strict tool calls and response_format with tools are not supported with this model's "
                            "chat template: its tool-call layout could not be read", "tools")
    turn, arguments = probe_turn(render, messages, prompt, name, unreadable)
    quoted = json.dumps(name, ensure_ascii=False)
    at, quoted_name = turn.rfind(quoted, 0, max(arguments, 0)), True
    if at < 0:
        at, quoted_name = turn.rfind(name, 0, max(arguments, 0)), False
    if arguments < 0 or at < 0:
        raise unreadable
    rest = turn[arguments + len(PROBE_ARGUMENTS):]
    ends = [i for i in (rest.find(text) for text in end_texts if text) if i >= 0]
    return CallLayout(before=turn[:at], between=turn[at + len(quoted if quoted_name else name):arguments],
                      after=rest[:min(ends)] if ends else rest.rstrip(), quoted_name=quoted_name)


class LarkText:
    """Text as Lark: literals, with the tokenizer's special tokens (which no literal matches) as ``<[id]>``."""

    def __init__(self, special_tokens: Mapping[str, int]) -> None:
        self._ids = dict(special_tokens)
        self._pattern = re.compile("|".join(re.escape(t) for t in sorted(self._ids, key=len, reverse=True))) \
            if self._ids else None

    def __call__(self, text: str) -> str:
        pieces, start = [], 0
        for match in self._pattern.finditer(text) if self._pattern else ():
            if match.start() > start:
                pieces.append(json.dumps(text[start:match.start()]))
            pieces.append(f"<[{self._ids[match.group()]}]>")
            start = match.end()
        if start < len(text):
            pieces.append(json.dumps(text[start:]))
        return " ".join(pieces) or '""'


def arguments_lark(tool: dict) -> str:
    """A function's arguments: its parameters' schema when it is strict, else any JSON object."""
    function = tool["function"]
    schema = function.get("parameters") if function.get("strict") else None
    return json_lark(json.dumps(schema) if isinstance(schema, dict) else ANY_OBJECT)


def is_strict(tool: dict) -> bool:
    return bool(tool["function"].get("strict"))


def reply_schema(grammar: common_pb2.Grammar) -> str:
    """The JSON schema of a response format's grammar (``json_object``: any object)."""
    return grammar.json_schema if grammar.WhichOneof("kind") == "json_schema" else ANY_OBJECT


def _sequence(*parts: str) -> str:
    return " ".join(p for p in parts if p != '""')


def _calls(layout: CallLayout, tools: list[dict], text: LarkText, with_before: bool) -> list[str]:
    """One Lark alternative per function: a whole call (``with_before``) or the call after its ``before``."""
    alternatives = []
    for tool in tools:
        name = tool["function"]["name"]
        written = json.dumps(name, ensure_ascii=False) if layout.quoted_name else name
        alternatives.append(_sequence(text((layout.before if with_before else "") + written + layout.between),
                                      arguments_lark(tool), text(layout.after)))
    return alternatives


def forced_call_lark(layout: CallLayout, tools: list[dict], function: str | None, text: LarkText) -> str | None:
    """The grammar of a forced call's sampled part (the opener is prompt: up to the arguments of ``function``, or
    up to the name the model picks), or None when no function it may call is strict."""
    candidates = [t for t in tools if function is None or t["function"]["name"] == function]
    if not any(is_strict(t) for t in candidates):
        return None
    if function is not None:
        return "start: " + _sequence(arguments_lark(candidates[0]), text(layout.after))
    return "start: " + " | ".join(f"({alternative})" for alternative in _calls(layout, candidates, text, False))


def reply_or_call_lark(schema_lark: str, layout: CallLayout, tools: list[dict], text: LarkText) -> str:
    """A reply that is a JSON document of the response format, or one tool call."""
    return "start: " + " | ".join([schema_lark, *(f"({c})" for c in _calls(layout, tools, text, True))])


__all__ = ["CallLayout", "LarkText", "call_layout", "forced_call_lark", "is_strict", "reply_or_call_lark",
           "reply_schema"]
