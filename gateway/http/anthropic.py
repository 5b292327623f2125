"""Anthropic's Messages API (``POST /v1/messages`` and ``/v1/messages/count_tokens``), so that agents written with
the ``anthropic`` client, and harnesses of the Claude Code family, train unchanged: a request's system prompt,
text, ``tool_use`` / ``tool_result`` and ``thinking`` blocks become the chat call every format runs (rendered with
the model's template, recorded token-in-token-out); the answer comes back as a ``message`` object or as Anthropic's
stream of named events; errors in Anthropic's shape.

A ``tool_use`` block comes back from the client as a parsed ``input`` object; the gateway renders it with the
arguments text the model wrote (``Conversations``), so the history splices token for token."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from forge.gateway.calls import ChatDelta, ChatResult
from forge.gateway.errors import BadRequest, GatewayError
from forge.gateway.forced_calls import check_tool_choice
from forge.gateway.http.conversations import Conversations
from forge.gateway.http.json_schemas import schema_grammar
from forge.gateway.http.openai import field_value, parse_sampling, read_tools, refuse_unsupported
from forge.gateway.http.wire import Answering, Event, StreamWriter, WireFormat, forge_json
from forge.gateway.messages import ChatCall, chat_message, check_grammar_with_tools, check_stop, tool_function
from forge.v1 import common_pb2

SUPPORTED = frozenset({"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                       "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config"})
# Accepted and ignored: they ask Anthropic's service for billing, placement, speed, prompt caching or diagnostics,
# and change nothing sampled.
IGNORED = frozenset({"metadata", "service_tier", "cache_control", "diagnostics", "inference_geo", "speed",
                     "user_profile_id", "workspace_id"})
WHY_NOT = {"mcp_servers": "the gateway calls no tools itself", "container": "the gateway runs no code",
           "context_management": "the agent manages its own context"}
IGNORED_BLOCK_KEYS = frozenset({"cache_control", "citations"})      # prompt caching is the actors' own
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


@dataclass(frozen=True)
class MessagesOptions:
    stream: bool = False
    message_id: str = ""


def _blocks(value: Any, where: str) -> list[dict]:
    """A content value as a list of blocks (a string is one text block), each an object with a ``type``."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", where)
    for i, block in enumerate(value):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}[{i}] must be a content block with a type", f"{where}[{i}]")
    return value


def _text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise BadRequest(f"{where}.text must be a string", f"{where}.text")
    return block["text"]


def _only_text(value: Any, where: str) -> str:
    """The text of a value that may hold only text blocks (a system prompt, a tool result)."""
    parts = []
    for i, block in enumerate(_blocks(value, where)):
        if block["type"] != "text":
            raise BadRequest(f"{where}[{i}]: only text blocks are supported here (got {block['type']!r})",
                             f"{where}[{i}]")
        parts.append(_text(block, f"{where}[{i}]"))
    return "".join(parts)


def _user_messages(blocks: list[dict], where: str) -> list[dict]:
    """A user turn: its text blocks as user messages and its tool results as tool messages, in their order."""
    messages: list[dict] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            messages.append(chat_message(where, "user", "".join(text)))
            text.clear()

    for i, block in enumerate(blocks):
        here = f"{where}.content[{i}]"
        if block["type"] == "text":
            text.append(_text(block, here))
        elif block["type"] == "tool_result":
            flush()
            if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                raise BadRequest(f"{here}.tool_use_id must be a non-empty string", f"{here}.tool_use_id")
            content = _only_text(block.get("content", ""), f"{here}.content")
            messages.append(chat_message(here, "tool", content, extras={"tool_call_id": block["tool_use_id"]}))
        else:
            raise BadRequest(f"{here}: a user turn takes text and tool_result blocks (got {block['type']!r})", here)
    flush()
    return messages


def _assistant_message(blocks: list[dict], where: str) -> dict:
    """An assistant turn: thinking as reasoning, text as content, tool_use blocks as tool calls (their ``input``
    objects are given their written text when the call runs: ``Messages.complete``)."""
    reasoning, text, calls = [], [], []
    for i, block in enumerate(blocks):
        here = f"{where}.content[{i}]"
        if block["type"] == "text":
            text.append(_text(block, here))
        elif block["type"] == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise BadRequest(f"{here}.thinking must be a string", f"{here}.thinking")
            reasoning.append(block["thinking"])
        elif block["type"] == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not block["name"]:
                raise BadRequest(f"{here} must have a string id and a non-empty name", here)
            if not isinstance(block.get("input"), dict):
                raise BadRequest(f"{here}.input must be an object", f"{here}.input")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": block["input"]}})
        else:
            raise BadRequest(f"{here}: an assistant turn takes text, thinking and tool_use blocks (got "
                             f"{block['type']!r})", here)
    return chat_message(where, "assistant", "".join(text) or (None if calls else ""), calls or None,
                        reasoning="".join(reasoning) or None)


def parse_messages(body: dict) -> list[dict]:
    messages = []
    if body.get("system") is not None:
        messages.append(chat_message("system", "system", _only_text(body["system"], "system")))
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequest("messages must be a non-empty list", "messages")
    for i, turn in enumerate(turns):
        where = f"messages[{i}]"
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise BadRequest(f"{where} must be an object whose role is 'user' or 'assistant'", f"{where}.role")
        blocks = _blocks(turn.get("content"), f"{where}.content")
        messages += (_user_messages(blocks, where) if turn["role"] == "user" else
                     [_assistant_message(blocks, where)])
    return messages


def parse_tools(body: dict) -> list[dict] | None:
    return read_tools(body, _client_tool)


def _client_tool(where: str, tool: Any) -> dict:
    if not isinstance(tool, dict):
        raise BadRequest(f"{where} must be an object", where)
    if tool.get("type", "custom") != "custom":
        raise BadRequest(f"{where}: Anthropic's server tools ({tool['type']!r}) are not supported; declare a client "
                         "tool with name, description and input_schema", where)
    if not isinstance(tool.get("strict", False), bool):
        raise BadRequest(f"{where}.strict must be a boolean", f"{where}.strict")
    return tool_function(where, {"name": tool.get("name"), "description": tool.get("description"),
                                 "parameters": tool.get("input_schema"), "strict": tool.get("strict") or None})


def parse_tool_choice(body: dict, tools: list[dict] | None) -> tuple[str, str | None, bool]:
    """(mode, forced function, parallel tool calls) of Anthropic's ``tool_choice``."""
    choice = field_value(body, "tool_choice", "dict")
    if choice is None:
        return "auto", None, True
    kind = choice.get("type")
    openai_form = {"auto": "auto", "none": "none", "any": "required",
                   "tool": {"type": "function", "function": {"name": choice.get("name")}}}.get(kind)
    if openai_form is None:
        raise BadRequest(f"tool_choice.type must be auto, any, tool or none (got {kind!r})", "tool_choice")
    mode, function = check_tool_choice(openai_form, tools)
    return mode, function, not choice.get("disable_parallel_tool_use", False)


def template_kwargs(body: dict) -> dict:
    """The chat template's variables of a request: ``thinking`` enabled or disabled as ``enable_thinking``
    (adaptive, and thinking between tool calls, leave the template's default; ``budget_tokens`` is not enforced),
    and ``output_config.effort`` as ``reasoning_effort``."""
    kwargs: dict = {}
    thinking = field_value(body, "thinking", "dict")
    if thinking is not None:
        if thinking.get("type") not in ("enabled", "disabled", "adaptive", "between_tools"):
            raise BadRequest("thinking.type must be enabled, disabled, adaptive or between_tools", "thinking")
        if thinking["type"] in ("enabled", "disabled"):
            kwargs["enable_thinking"] = thinking["type"] == "enabled"
    output = field_value(body, "output_config", "dict", {})
    if output.get("effort") is not None:
        if not isinstance(output["effort"], str):
            raise BadRequest("output_config.effort must be a string", "output_config.effort")
        kwargs["reasoning_effort"] = output["effort"]
    return kwargs


def output_format_grammar(body: dict) -> common_pb2.Grammar | None:
    """The grammar ``output_config.format`` asks for: the schema of ``{"type": "json_schema", "schema": ...}``."""
    form = field_value(body, "output_config", "dict", {}).get("format")
    if form is None:
        return None
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        kind = form.get("type") if isinstance(form, dict) else form
        raise BadRequest(f"output_config.format must be {{'type': 'json_schema', 'schema': {{...}}}} (got {kind!r})",
                         "output_config.format")
    return schema_grammar(form.get("schema"), "output_config.format", "output_config.format.schema")


def parse_messages_request(body: dict, vocab_size: int, context_length: int | None, needs_max_tokens: bool = True
                           ) -> tuple[ChatCall, MessagesOptions]:
    refuse_unsupported(body, SUPPORTED, IGNORED, WHY_NOT, {})
    field_value(body, "model", "str")
    if needs_max_tokens and body.get("max_tokens") is None:
        raise BadRequest("max_tokens is required", "max_tokens")
    messages = parse_messages(body)
    tools = parse_tools(body)
    mode, function, parallel = parse_tool_choice(body, tools)
    stop = check_stop(field_value(body, "stop_sequences", "list", []), "stop_sequences")
    sampling = parse_sampling({name: body.get(name) for name in ("temperature", "top_p", "top_k", "max_tokens")},
                              vocab_size, context_length, output_format_grammar(body), "output_config.format")
    check_grammar_with_tools(sampling, tools, mode, "output_config.format")
    call = ChatCall(messages, tools, bool(tools) and mode != "none", sampling, stop, template_kwargs(body), parallel,
                    mode == "required", function, "output_config.format")
    return call, MessagesOptions(field_value(body, "stream", "bool", False), "msg_" + uuid.uuid4().hex)


# ---------------------------------------------------------------------------------------------- answers


def stop_reason(result: ChatResult) -> str:
    if result.parsed and result.parsed.tool_calls:
        return "tool_use"
    if result.stopped_by_string:
        return "stop_sequence"
    return "max_tokens" if result.finish_reason == common_pb2.FINISH_REASON_LENGTH else "end_turn"


def usage_json(result: ChatResult) -> dict:
    return {"input_tokens": len(result.prompt_ids), "output_tokens": len(result.completion_ids),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def tool_use_block(call: Any) -> dict:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}


def message_json(result: ChatResult, answering: Answering, options: MessagesOptions) -> dict:
    parsed = result.parsed
    content: list[dict] = []
    if parsed.reasoning:
        content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content or not parsed.tool_calls:
        content.append({"type": "text", "text": parsed.content})
    content += [tool_use_block(call) for call in parsed.tool_calls]
    return {"id": options.message_id, "type": "message", "role": "assistant", "model": answering.model_name,
            "content": content, "stop_reason": stop_reason(result),
            "stop_sequence": result.stop_string if result.stopped_by_string else None, "usage": usage_json(result),
            "forge": forge_json(result)}


class MessageEvents(StreamWriter):
    """Anthropic's stream: ``message_start``; per content block ``content_block_start``, its deltas and
    ``content_block_stop`` (thinking, then text, then each tool use); ``message_delta`` with the stop reason and
    usage; ``message_stop``."""

    def __init__(self, answering: Answering, options: MessagesOptions) -> None:
        self.answering = answering
        self.options = options
        self.index = -1
        self.open: str | None = None

    @staticmethod
    def event(name: str, **body: Any) -> Event:
        return Event({"type": name, **body}, name)

    def first(self) -> list[Event]:
        message = {"id": self.options.message_id, "type": "message", "role": "assistant",
                   "model": self.answering.model_name, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [self.event("message_start", message=message)]

    def _block(self, kind: str, start: dict) -> list[Event]:
        """Close the open block unless it is a ``kind`` one, and open one of ``kind``."""
        if self.open == kind:
            return []
        events = self._close()
        self.index += 1
        self.open = kind
        return [*events, self.event("content_block_start", index=self.index, content_block=start)]

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        return [self.event("content_block_stop", index=self.index)]

    def deltas(self, delta: ChatDelta) -> list[Event]:
        events = []
        if delta.reasoning:
            events += self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            events.append(self.event("content_block_delta", index=self.index,
                                     delta={"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            events += self._block("text", {"type": "text", "text": ""})
            events.append(self.event("content_block_delta", index=self.index,
                                     delta={"type": "text_delta", "text": delta.content}))
        return events

    def final(self, result: ChatResult) -> list[Event]:
        events = self.deltas(result)
        if self.index < 0 and not result.parsed.tool_calls:
            events += self._block("text", {"type": "text", "text": ""})
        events += self._close()
        for call in result.parsed.tool_calls:
            self.index += 1
            events += [self.event("content_block_start", index=self.index,
                                  content_block={"type": "tool_use", "id": call.id, "name": call.name, "input": {}}),
                       self.event("content_block_delta", index=self.index,
                                  delta={"type": "input_json_delta", "partial_json": call.arguments}),
                       self.event("content_block_stop", index=self.index)]
        usage = usage_json(result)
        events.append(self.event("message_delta", delta={
            "stop_reason": stop_reason(result), "stop_sequence": result.stop_string if result.stopped_by_string
            else None}, usage={"output_tokens": usage["output_tokens"], "input_tokens": usage["input_tokens"]},
            forge=forge_json(result)))
        return [*events, self.event("message_stop")]

    def failed(self, error: GatewayError) -> list[Event]:
        return [Event(error_json(error), "error")]


def error_json(error: GatewayError) -> dict:
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


class Messages(WireFormat):
    """Anthropic's ``POST /v1/messages``."""

    name = "messages"

    def parse(self, body: dict, vocab_size: int, context_length: int | None) -> tuple[ChatCall, MessagesOptions]:
        return parse_messages_request(body, vocab_size, context_length)

    def complete(self, call: ChatCall, options: MessagesOptions, conversations: Conversations,
                 session_id: str | None) -> tuple[ChatCall, str | None]:
        for message in call.messages:
            for tool_call in message.get("tool_calls") or ():
                function = tool_call["function"]
                if isinstance(function["arguments"], dict):
                    function["arguments"] = conversations.arguments_text(tool_call["id"], function["arguments"])
        return call, session_id

    def answer(self, result: ChatResult, answering: Answering, options: MessagesOptions) -> dict:
        return message_json(result, answering, options)

    def writer(self, answering: Answering, options: MessagesOptions) -> MessageEvents:
        return MessageEvents(answering, options)

    def remember(self, call: ChatCall, options: MessagesOptions, result: ChatResult,
                 conversations: Conversations) -> None:
        for tool_call in result.parsed.tool_calls:
            conversations.keep_arguments(tool_call.id, tool_call.arguments)

    def error(self, error: GatewayError) -> dict:
        return error_json(error)
