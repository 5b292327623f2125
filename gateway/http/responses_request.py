"""The Responses API's request (``POST /v1/responses``, see ``forge.gateway.http.responses``) read into the chat
call every format runs and the options its answer is written with: ``instructions``, the ``input`` items (an
assistant turn's items merged into the one message the model wrote), function tools, ``tool_choice``,
``text.format`` and the sampling fields, each refused with a 400 naming it when the gateway cannot honour it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from forge.gateway.errors import BadRequest
from forge.gateway.forced_calls import check_tool_choice
from forge.gateway.http.json_schemas import json_object_grammar, named_schema_grammar
from forge.gateway.http.openai import (
    field_value,
    parse_sampling,
    parse_stop,
    refuse_unsupported,
    template_kwargs,
)
from forge.gateway.messages import ChatCall, chat_message, check_grammar_with_tools, tool_function
from forge.v1 import common_pb2

SUPPORTED = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p",
    "max_output_tokens", "stream", "stream_options", "previous_response_id", "reasoning", "text", "include",
    "truncation", "background", "top_logprobs", "top_k", "seed", "stop", "chat_template_kwargs"})
# Accepted and ignored: they ask OpenAI's service for storage, billing, caching, moderation hints or limits on its
# hosted tools (there are none here), and change nothing sampled.
IGNORED = frozenset({"store", "metadata", "user", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                     "prompt_cache_options", "safety_identifier", "max_tool_calls"})
WHY_NOT = {
    "conversation": "the gateway keeps no conversation objects; chain responses with previous_response_id",
    "prompt": "prompt templates are stored on OpenAI's service; send instructions and input",
    "context_management": "the agent manages its own context",
    "moderation": "the gateway does not moderate",
}
# include values that ask for what the gateway does not return: refused, since an empty answer would be wrong.
REFUSED_INCLUDES = {"message.output_text.logprobs": "logprobs are not returned by the Responses API here; chat "
                                                     "completions return them (logprobs), and the session's "
                                                     "records hold them (GET /v1/sessions/{id}?include_ids=1)"}
TEXT_PARTS = ("input_text", "output_text")
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
HOSTED_TOOL = ("OpenAI's hosted tool {kind!r} is not supported: the gateway runs no tools; declare a function tool "
               "({{'type': 'function', 'name': ..., 'parameters': ...}}) and run it in the agent")
TOOL_CHOICE_FORMS = "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}"
TEXT_FORMATS = ("text.format must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'name': "
                "..., 'schema': {...}}")


@dataclass
class ResponsesOptions:
    """A request's answer settings: its response id (made at parse time, so that the answer, the stream and what
    is kept agree) and what the response object repeats."""

    response_id: str
    created_at: int
    stream: bool = False
    has_instructions: bool = False          # the call's first message is the request's instructions
    previous_response_id: str | None = None
    echo: dict = field(default_factory=dict)    # the request's settings the response object repeats
    # The session the call was given (by its request, or by the previous response), once ``complete`` has run;
    # None: a one-call session of its own, closed once answered, which a later response cannot continue.
    session_id: str | None = None


def _text(value: Any, where: str) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a string or a list of text parts", where)
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}[{j}]: only text parts ({', '.join(TEXT_PARTS)}) with a string text are "
                             f"supported (got {kind!r})", f"{where}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: dict, name: str, where: str, empty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not (value or empty):
        raise BadRequest(f"{where}.{name} must be a{'' if empty else ' non-empty'} string", f"{where}.{name}")
    return value


def _reasoning_text(item: dict, where: str) -> str:
    """The reasoning the model wrote, from a reasoning item's ``content`` (its ``summary`` is not what was
    written, and is left out)."""
    summary = item.get("summary", [])
    if not isinstance(summary, list):
        raise BadRequest(f"{where}.summary must be a list", f"{where}.summary")
    content = item.get("content") or []
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a list of reasoning_text parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "reasoning_text" or not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}.content[{j}] must be {{'type': 'reasoning_text', 'text': ...}}",
                             f"{where}.content[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def _function_call(item: dict, where: str) -> dict:
    call_id, name = _string(item, "call_id", where), _string(item, "name", where)
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise BadRequest(f"{where}.arguments must be a string (the call's JSON arguments)", f"{where}.arguments")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_output(item: dict, where: str) -> dict:
    call_id = _string(item, "call_id", where)
    output = item.get("output")
    if output is None:
        raise BadRequest(f"{where}.output is required", f"{where}.output")
    return chat_message(where, "tool", _text(output, f"{where}.output"), extras={"tool_call_id": call_id})


@dataclass
class AssistantTurn:
    """The items of one assistant turn, merged into one message: reasoning, then text, then function calls."""

    where: str
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)

    @property
    def spoken(self) -> bool:
        """Whether text or a call has come: a reasoning item or message after them opens another turn."""
        return bool(self.content or self.calls)

    def message(self) -> dict:
        text = "".join(self.content)
        return chat_message(self.where, "assistant", text or (None if self.calls else ""), self.calls or None,
                            reasoning="".join(self.reasoning) or None)


def parse_input(value: Any) -> list[dict]:
    """The messages of ``input``: a string is one user message; a list holds items, an assistant turn's items
    (reasoning, message, function calls, in that order) merging into one assistant message."""
    if isinstance(value, str):
        return [chat_message("input", "user", value)]
    if not isinstance(value, list) or not value:
        raise BadRequest("input must be a string or a non-empty list of items", "input")
    messages: list[dict] = []
    turn: AssistantTurn | None = None
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", where)
        kind = item.get("type", "message")
        role = item.get("role")
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            if turn is not None and turn.spoken and kind != "function_call":
                messages.append(turn.message())
                turn = None
            turn = turn or AssistantTurn(where)
            if kind == "reasoning":
                turn.reasoning.append(_reasoning_text(item, where))
            elif kind == "function_call":
                turn.calls.append(_function_call(item, where))
            else:
                turn.content.append(_text(item.get("content"), f"{where}.content"))
            continue
        if turn is not None:
            messages.append(turn.message())
            turn = None
        if kind == "function_call_output":
            messages.append(_function_output(item, where))
        elif kind == "message":
            if role not in MESSAGE_ROLES:
                raise BadRequest(f"{where}.role must be one of {', '.join(MESSAGE_ROLES)} (got {role!r})",
                                 f"{where}.role")
            messages.append(chat_message(where, role, _text(item.get("content"), f"{where}.content")))
        else:
            raise BadRequest(f"{where}.type {kind!r} is not supported: input items are messages, function_call, "
                             "function_call_output and reasoning", f"{where}.type")
    if turn is not None:
        messages.append(turn.message())
    return messages


def parse_tools(body: dict) -> tuple[list[dict] | None, list[dict]]:
    """(the tools in OpenAI's chat form, the same as the response object repeats them)."""
    tools = field_value(body, "tools", "list")
    if not tools:
        return None, []
    checked, echoed = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"{where} must be an object", where)
        kind = tool.get("type")
        if kind != "function":
            raise BadRequest(f"{where}: " + HOSTED_TOOL.format(kind=kind), where)
        _string(tool, "name", where)
        for name, kinds, what in (("description", str, "a string"), ("parameters", dict, "a JSON schema object"),
                                  ("strict", bool, "a boolean")):
            if not isinstance(tool.get(name), kinds | None):
                raise BadRequest(f"{where}.{name} must be {what}", f"{where}.{name}")
        function = {name: tool.get(name) for name in ("name", "description", "parameters")}
        checked.append(tool_function(where, {**function, "strict": tool.get("strict")}))
        echoed.append({"type": "function", **function, "strict": tool.get("strict")})
    return checked, echoed


def parse_tool_choice(body: dict, tools: list[dict] | None) -> tuple[str, str | None]:
    """(mode, forced function) of the Responses ``tool_choice``."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise BadRequest(f"{TOOL_CHOICE_FORMS} (got type {choice.get('type')!r}: the gateway runs no hosted "
                             "tools)", "tool_choice")
        if not isinstance(choice.get("name"), str):
            raise BadRequest(f"{TOOL_CHOICE_FORMS}: a function's name is a string", "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None and choice not in ("auto", "none", "required"):
        raise BadRequest(f"{TOOL_CHOICE_FORMS} (got {choice!r})", "tool_choice")
    return check_tool_choice(choice, tools)


def _keys(value: dict, allowed: tuple[str, ...], name: str) -> None:
    for key in value:
        if key not in allowed and value[key] is not None:
            raise BadRequest(f"{name}.{key} is not supported by this gateway", f"{name}.{key}")


def parse_settings(body: dict) -> dict:
    """The chat template's variables (``reasoning.effort`` as ``reasoning_effort``), with ``text``, ``include``
    and the fields accepted at one value checked."""
    reasoning = field_value(body, "reasoning", "dict", {})
    _keys(reasoning, ("effort", "summary", "generate_summary"), "reasoning")
    effort = reasoning.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise BadRequest("reasoning.effort must be a string", "reasoning.effort")
    _keys(field_value(body, "text", "dict", {}), ("format", "verbosity"), "text")
    for j, name in enumerate(field_value(body, "include", "list", [])):
        if not isinstance(name, str):
            raise BadRequest(f"include[{j}] must be a string", f"include[{j}]")
        if name in REFUSED_INCLUDES:
            raise BadRequest(f"include {name!r} is not supported: {REFUSED_INCLUDES[name]}", "include")
    if field_value(body, "truncation", "str", "disabled") != "disabled":
        raise BadRequest("truncation must be 'disabled': the gateway never drops input to fit the context (a "
                         "prompt too long is refused with context_length_exceeded)", "truncation")
    if field_value(body, "background", "bool", False):
        raise BadRequest("background must be false: every response is answered on its request", "background")
    if field_value(body, "top_logprobs", "int", 0):
        raise BadRequest(f"top_logprobs must be 0: {REFUSED_INCLUDES['message.output_text.logprobs']}",
                         "top_logprobs")
    field_value(body, "stream_options", "dict")
    return template_kwargs({"chat_template_kwargs": body.get("chat_template_kwargs"), "reasoning_effort": effort})


def text_format_grammar(body: dict) -> common_pb2.Grammar | None:
    """The grammar ``text.format`` asks for: None for text (the default), any JSON object for ``json_object``, the
    schema of ``json_schema``."""
    form = field_value(body, "text", "dict", {}).get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise BadRequest(f"{TEXT_FORMATS} (got {kind if isinstance(form, dict) else form!r})", "text.format")
    return named_schema_grammar(form, "text.format", "text.format")


def parse_limits(body: dict, vocab_size: int, context_length: int | None) -> common_pb2.SamplingParams:
    limit = field_value(body, "max_output_tokens", "int")
    if limit is not None and (limit < 1 or (context_length is not None and limit >= context_length)):
        raise BadRequest(f"max_output_tokens must be >= 1 and below the model's context ({context_length} tokens, "
                         f"prompt included), got {limit}", "max_output_tokens",
                         None if limit < 1 else "context_length_exceeded")
    return parse_sampling({**{name: body.get(name) for name in ("temperature", "top_p", "top_k", "seed")},
                           "max_tokens": limit}, vocab_size, context_length, text_format_grammar(body), "text.format")


def parse_responses_request(body: Any, vocab_size: int, context_length: int | None = None
                            ) -> tuple[ChatCall, ResponsesOptions]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    refuse_unsupported(body, SUPPORTED, IGNORED, WHY_NOT, {})
    field_value(body, "model", "str")
    instructions = field_value(body, "instructions", "str")
    if "input" not in body or body["input"] is None:
        raise BadRequest("input is required: a string or a list of items", "input")
    messages = parse_input(body["input"])
    if instructions is not None:
        messages.insert(0, chat_message("instructions", "system", instructions))
    tools, echoed_tools = parse_tools(body)
    mode, function = parse_tool_choice(body, tools)
    parallel = field_value(body, "parallel_tool_calls", "bool", True)
    previous = field_value(body, "previous_response_id", "str")
    kwargs = parse_settings(body)
    sampling = parse_limits(body, vocab_size, context_length)
    check_grammar_with_tools(sampling, tools, mode, "text.format")
    call = ChatCall(messages, tools, bool(tools) and mode != "none", sampling, parse_stop(body), kwargs, parallel,
                    mode == "required", function, "text.format")
    echo = {"instructions": instructions, "tools": echoed_tools, "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": parallel, "temperature": field_value(body, "temperature", "number", 1.0),
            "top_p": field_value(body, "top_p", "number", 1.0), "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": previous, "truncation": "disabled", "top_logprobs": 0,
            "reasoning": {"effort": None, "summary": None, **field_value(body, "reasoning", "dict", {})},
            "text": {"format": {"type": "text"}, **{k: v for k, v in field_value(body, "text", "dict", {}).items()
                                                    if v is not None}},
            "metadata": field_value(body, "metadata", "dict", {})}
    options = ResponsesOptions("resp_" + uuid.uuid4().hex, int(time.time()), field_value(body, "stream", "bool", False),
                               instructions is not None, previous, echo)
    return call, options
