"""OpenAI's Responses API (``POST /v1/responses``), the default model path of the OpenAI Agents SDK, so that agents
written with it train unchanged: a request's ``instructions``, ``input`` items (messages, function calls and their
outputs, reasoning) and function tools become the chat call every format runs (rendered with the model's
template, recorded token-in-token-out; the request is read in ``forge.gateway.http.responses_request``); the answer
comes back as a ``response`` object of output items (reasoning, message, function calls) or as the Responses
stream of named events, written here.

An assistant turn comes back as several items (a reasoning item, a message, function calls): consecutive ones
merge into the one assistant message the model wrote, with the function calls' ``arguments`` text as written, so
the history renders to the recorded prompt and completion and splices token for token. ``previous_response_id``
continues a conversation the gateway keeps (``Conversations``): the earlier request's messages and the answer as
the model wrote it, in the session that answer ran in (a call outside any session runs in a one-call session,
closed once answered: the next one continues the conversation in a session of its own)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from forge.gateway.calls import ChatDelta, ChatResult
from forge.gateway.errors import GatewayError, NotFound
from forge.gateway.http.conversations import Conversations, StoredResponse
from forge.gateway.http.openai import message_json
from forge.gateway.http.responses_request import ResponsesOptions, parse_responses_request
from forge.gateway.http.wire import Answering, Event, StreamWriter, WireFormat, forge_json
from forge.gateway.messages import ChatCall, chat_message
from forge.parsing.completion import ToolCall
from forge.v1 import common_pb2

ITEM_PREFIXES = {"reasoning": "rs_", "message": "msg_", "call": "fc_"}


class ItemIds:
    """The ids of a response's output items, made as each is first named (so that a stream's events and its final
    response agree)."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}

    def of(self, kind: str, index: int = 0) -> str:
        key = f"{kind}{index}"
        if key not in self._ids:
            self._ids[key] = ITEM_PREFIXES[kind] + uuid.uuid4().hex
        return self._ids[key]


def incomplete(result: ChatResult) -> bool:
    return result.finish_reason == common_pb2.FINISH_REASON_LENGTH and not result.stopped_by_string


def reasoning_item(item_id: str, text: str | None) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [text_part(text)]}


def call_item(item_id: str, call: ToolCall, status: str, arguments: str | None = None) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments, "status": status}


def output_items(result: ChatResult, ids: ItemIds) -> list[dict]:
    """Reasoning (when the model wrote some), the message (its text, or an empty one when nothing else came) and
    one item per function call."""
    parsed = result.parsed
    items = []
    if parsed.reasoning:
        items.append(reasoning_item(ids.of("reasoning"), parsed.reasoning))
    if parsed.content or not parsed.tool_calls:
        items.append(message_item(ids.of("message"), parsed.content,
                                  "incomplete" if incomplete(result) else "completed"))
    items += [call_item(ids.of("call", i), call, "completed") for i, call in enumerate(parsed.tool_calls)]
    return items


def usage_json(result: ChatResult) -> dict:
    prompt, completion = len(result.prompt_ids), len(result.completion_ids)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def response_json(answering: Answering, options: ResponsesOptions, status: str, **fields: Any) -> dict:
    """A response object: its settings as the request gave them, ``status``, and ``fields`` (output, usage, ...)."""
    return {"id": options.response_id, "object": "response", "created_at": options.created_at, "status": status,
            "incomplete_details": None, "model": answering.model_name, "output": [], "usage": None, "error": None,
            **options.echo, **fields}


def final_response(result: ChatResult, answering: Answering, options: ResponsesOptions, ids: ItemIds) -> dict:
    cut = incomplete(result)
    return response_json(answering, options, "incomplete" if cut else "completed",
                         incomplete_details={"reason": "max_output_tokens"} if cut else None,
                         output=output_items(result, ids), usage=usage_json(result),
                         forge=forge_json(result))


class ResponseEvents(StreamWriter):
    """The Responses stream: ``response.created`` and ``response.in_progress``; per output item
    ``response.output_item.added``, its content part (``response.content_part.added``, text deltas and ``.done``,
    ``response.content_part.done``) or a function call's arguments (``response.function_call_arguments.delta`` and
    ``.done``), ``response.output_item.done``; then ``response.completed`` (or ``response.incomplete``) with the
    whole response. Reasoning streams as ``response.reasoning_text.delta``, text as ``response.output_text.delta``;
    function calls come whole once the call ends."""

    def __init__(self, answering: Answering, options: ResponsesOptions) -> None:
        self.answering = answering
        self.options = options
        self.ids = ItemIds()
        self.sequence = 0
        self.index = -1
        self.open: str | None = None        # the kind of the item whose text is streaming
        self.text = ""
        self.opened: set[str] = set()

    def event(self, kind: str, /, **body: Any) -> Event:
        event = Event({"type": kind, "sequence_number": self.sequence, **body}, kind)
        self.sequence += 1
        return event

    def first(self) -> list[Event]:
        response = response_json(self.answering, self.options, "in_progress")
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def _where(self) -> dict:
        return {"item_id": self.ids.of(self.open), "output_index": self.index}

    def _open(self, kind: str) -> list[Event]:
        if self.open == kind:
            return []
        events = self._close("completed")
        self.index += 1
        self.open, self.text = kind, ""
        self.opened.add(kind)
        item_id = self.ids.of(kind)
        item = reasoning_item(item_id, None) if kind == "reasoning" else message_item(item_id, None, "in_progress")
        part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else text_part("")
        return [*events, self.event("response.output_item.added", output_index=self.index, item=item),
                self.event("response.content_part.added", **self._where(), content_index=0, part=part)]

    def _close(self, status: str) -> list[Event]:
        if self.open is None:
            return []
        where, text = self._where(), self.text
        if self.open == "reasoning":
            done = self.event("response.reasoning_text.done", **where, content_index=0, text=text)
            item = reasoning_item(where["item_id"], text)
        else:
            done = self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            item = message_item(where["item_id"], text, status)
        self.open = None
        return [done, self.event("response.content_part.done", **where, content_index=0, part=item["content"][0]),
                self.event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _delta(self, kind: str, text: str) -> list[Event]:
        events = self._open(kind)
        self.text += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self.event(name, **self._where(), content_index=0, delta=text, **extra)]

    def deltas(self, delta: ChatDelta) -> list[Event]:
        events = []
        if delta.reasoning:
            events += self._delta("reasoning", delta.reasoning)
        if delta.content:
            events += self._delta("message", delta.content)
        return events

    def final(self, result: ChatResult) -> list[Event]:
        events = self.deltas(result)
        calls = result.parsed.tool_calls
        if "message" not in self.opened and not calls:
            events += self._open("message")
        events += self._close("incomplete" if incomplete(result) else "completed")
        for i, call in enumerate(calls):
            self.index += 1
            where = {"item_id": self.ids.of("call", i), "output_index": self.index}
            events += [
                self.event("response.output_item.added", output_index=self.index,
                           item=call_item(where["item_id"], call, "in_progress", "")),
                self.event("response.function_call_arguments.delta", **where, delta=call.arguments),
                self.event("response.function_call_arguments.done", **where, name=call.name,
                           arguments=call.arguments),
                self.event("response.output_item.done", output_index=self.index,
                           item=call_item(where["item_id"], call, "completed"))]
        response = final_response(result, self.answering, self.options, self.ids)
        name = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [*events, self.event(name, response=response)]

    def failed(self, error: GatewayError) -> list[Event]:
        code = error.code or ("server_error" if error.status >= 500 else error.error_type)
        response = response_json(self.answering, self.options, "failed",
                                 error={"code": code, "message": error.message})
        return [self.event("response.failed", response=response)]


class Responses(WireFormat):
    """OpenAI's ``POST /v1/responses``."""

    name = "responses"

    def parse(self, body: dict, vocab_size: int, context_length: int | None) -> tuple[ChatCall, ResponsesOptions]:
        return parse_responses_request(body, vocab_size, context_length)

    def complete(self, call: ChatCall, options: ResponsesOptions, conversations: Conversations,
                 session_id: str | None) -> tuple[ChatCall, str | None]:
        """The stored conversation of ``previous_response_id`` put after the instructions, in its session unless
        the request names one (a response that ran in a one-call session has none to continue in)."""
        if options.previous_response_id is not None:
            stored = conversations.response(options.previous_response_id)
            if stored is None:
                raise NotFound(f"previous_response_id {options.previous_response_id!r} is not a response this "
                               "gateway keeps (it keeps the latest ones, in memory)", "previous_response_id")
            head = call.messages[:1] if options.has_instructions else []
            call = replace(call, messages=[*head, *stored.messages, *call.messages[len(head):]])
            session_id = session_id or stored.session_id
        options.session_id = session_id
        return call, session_id

    def answer(self, result: ChatResult, answering: Answering, options: ResponsesOptions) -> dict:
        return final_response(result, answering, options, ItemIds())

    def writer(self, answering: Answering, options: ResponsesOptions) -> ResponseEvents:
        return ResponseEvents(answering, options)

    def remember(self, call: ChatCall, options: ResponsesOptions, result: ChatResult,
                 conversations: Conversations) -> None:
        """The conversation behind the answer, without the request's instructions, and the session it ran in
        unless that was a one-call session: what a later request continues with ``previous_response_id``."""
        answer = message_json(result)
        said = chat_message("output", "assistant", answer["content"], answer.get("tool_calls"),
                            reasoning=answer.get("reasoning_content"))
        messages = [*call.messages[1 if options.has_instructions else 0:], said]
        session_id = result.session_id if options.session_id is not None else None
        conversations.keep_response(options.response_id, StoredResponse(session_id, messages))
