"""Forced tool calls (``tool_choice: "required"`` or a named function), served exactly: the gateway writes the
beginning of the tool call into the prompt, after the generation prompt, and the model samples the rest.

What is sampled is then an ordinary continuation of an ordinary prompt, so the recorded log-probabilities are the
ones the learner recomputes (no logits were masked), and the answer parses as a tool call like any other. The
opener is read from the model's own chat template rather than written per syntax: the conversation is rendered
once with the generation prompt and once with an assistant turn holding a probe call; what the second adds is the
template's tool-call layout, cut where the model takes over (before the function's name for "required", before the
arguments for a named function). Because the opener is the template's own rendering, the history a client sends
back (the assistant message with its tool call) renders to the recorded prompt and completion, and token-in-token-
out splices it.

A model that writes something other than a well-formed call after the opener (a random-weight one may) gets its
text back as content: without constrained decoding nothing forces the arguments to parse."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from forge.gateway.errors import BadRequest

PROBE_ARGUMENTS = '{"forge_probe": 0}'


def tool_names(tools: list[dict] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or []]


def check_tool_choice(choice: Any, tools: list[dict] | None) -> tuple[str, str | None]:
    """(mode, function name) of a request's ``tool_choice``: mode ``auto``, ``none`` or ``required``; a named
    function (``{"type": "function", "function": {"name": ...}}``) is ``required`` with its name."""
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise BadRequest("tool_choice 'required' needs tools", "tool_choice")
        return choice, None
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type", "function") == "function" and isinstance(name, str)):
        raise BadRequest("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                         "{'name': ...}}", "tool_choice")
    if name not in tool_names(tools):
        raise BadRequest(f"tool_choice names the function {name!r}, which is not among the tools "
                         f"({', '.join(tool_names(tools)) or 'none given'})", "tool_choice")
    return "required", name


def probe_turn(render: Callable[..., str], messages: list[dict], prompt: str, name: str, unreadable: BadRequest
               ) -> tuple[str, int]:
    """The assistant turn the template writes after ``messages`` (``prompt``: them rendered with the generation
    prompt) for one call of ``name`` with ``PROBE_ARGUMENTS``, and where those arguments begin in it (-1: not
    written as given); ``unreadable`` is raised when the turn does not extend ``prompt``."""
    probe = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_probe", "type": "function", "function": {"name": name, "arguments": PROBE_ARGUMENTS}}]}
    whole = render([*messages, probe], add_generation_prompt=False)
    if not whole.startswith(prompt):
        raise unreadable
    turn = whole[len(prompt):]
    return turn, turn.find(PROBE_ARGUMENTS)


def tool_call_opener(render: Callable[..., str], messages: list[dict], prompt: str, function: str | None,
                     tools: list[dict]) -> str:
    """The text that begins the forced tool call, to append to ``prompt`` (``messages`` rendered with the
    generation prompt by ``render(messages, add_generation_prompt=...)``): up to the arguments of ``function``,
    or with ``function`` None up to the name of whichever function the model picks."""
    name = function or tool_names(tools)[0]
    unreadable = BadRequest("forced tool calls (tool_choice 'required' or a named function) are not supported with "
                            "this model's chat template: its tool-call layout could not be read", "tool_choice")
    turn, end = probe_turn(render, messages, prompt, name, unreadable)
    if function is None:
        end = turn.find(json.dumps(name, ensure_ascii=False), 0, max(end, 0))
    if end <= 0:
        raise unreadable
    return turn[:end]
