"""One chat call as the gateway runs it, whichever front end it came from: template-ready messages, tools, the
sampling parameters as applied and stop strings; with the checks shared by HTTP and gRPC."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from forge.gateway.errors import BadRequest
from forge.model.sampling import MAX_TOP_LOGPROBS, temperature_problem
from forge.tokenizer.tokenizer import NAMED_SPECIAL_TOKENS
from forge.v1 import common_pb2, gateway_pb2

ROLES = ("system", "user", "assistant", "tool")
WHOLE_TEXT_ROLES = ("system", "user", "tool")      # chat templates show these messages' content whole
MAX_SEED = 2**63
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
# Variables the gateway itself gives the chat template: chat_template_kwargs may not replace them.
TEMPLATE_OWN = frozenset({"messages", "tools", "documents", "add_generation_prompt", *NAMED_SPECIAL_TOKENS})


@dataclass
class ChatCall:
    messages: list[dict]
    tools: list[dict] | None = None         # OpenAI tool dicts: {"type": "function", "function": {...}}
    parse_tools: bool = False               # parse tool calls out of the completion (tools given, choice "auto")
    sampling: common_pb2.SamplingParams = field(default_factory=common_pb2.SamplingParams)
    stop: list[str] = field(default_factory=list)
    template_kwargs: dict = field(default_factory=dict)    # extra chat template variables (chat_template_kwargs)
    parallel_tool_calls: bool = True        # False: at most one tool call is returned


def shown_chars(call: ChatCall) -> int:
    """Characters of text the rendered prompt surely contains: the content of system, user and tool messages,
    without surrounding whitespace (a template may trim it). Assistant turns are left out: templates may drop
    earlier reasoning or rewrite the content."""
    total = 0
    for message in call.messages:
        content = message.get("content")
        if message.get("role") in WHOLE_TEXT_ROLES and isinstance(content, str):
            total += len(content.strip())
    return total


def check_sampling(sampling: common_pb2.SamplingParams, vocab_size: int, context_length: int | None = None
                   ) -> common_pb2.SamplingParams:
    """A checked copy with every default made explicit (temperature 1, top_p 1), as recorded in the pool. With
    ``context_length``, max_tokens and min_tokens must leave room for a prompt."""
    checked = common_pb2.SamplingParams()
    checked.CopyFrom(sampling)
    temperature = sampling.temperature if sampling.HasField("temperature") else 1.0
    problem = temperature_problem(temperature)
    if problem:
        raise BadRequest(problem, "temperature")
    checked.temperature = temperature
    if not 0.0 <= sampling.top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {sampling.top_p}", "top_p")
    checked.top_p = sampling.top_p or 1.0
    if sampling.top_k < 0:
        raise BadRequest(f"top_k must be >= 0, got {sampling.top_k}", "top_k")
    if sampling.max_tokens < 0:
        raise BadRequest(f"max_tokens must be >= 1, got {sampling.max_tokens}", "max_tokens")
    if context_length is not None and sampling.max_tokens >= context_length:
        raise BadRequest(f"max_tokens is {sampling.max_tokens}; the model's context is {context_length} tokens, "
                         "prompt included", "max_tokens", "context_length_exceeded")
    if sampling.min_tokens < 0:
        raise BadRequest(f"min_tokens must be >= 0, got {sampling.min_tokens}", "min_tokens")
    if sampling.max_tokens and sampling.min_tokens > sampling.max_tokens:
        raise BadRequest(f"min_tokens ({sampling.min_tokens}) must not exceed max_tokens ({sampling.max_tokens})",
                         "min_tokens")
    if context_length is not None and sampling.min_tokens >= context_length:
        raise BadRequest(f"min_tokens is {sampling.min_tokens}; the model's context is {context_length} tokens",
                         "min_tokens", "context_length_exceeded")
    if not 0 <= sampling.top_logprobs <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {sampling.top_logprobs}",
                         "top_logprobs")
    if sampling.HasField("seed") and sampling.seed >= MAX_SEED:
        raise BadRequest(f"seed must be in [0, 2**63), got {sampling.seed}", "seed")
    bad = [t for t in sampling.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"stop token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", "stop_token_ids")
    return checked


def check_stop(stop: list[str]) -> list[str]:
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequest(f"at most {MAX_STOP_STRINGS} stop strings (got {len(stop)})", "stop")
    if any(not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise BadRequest(f"stop strings must be non-empty strings of at most {MAX_STOP_CHARS} characters", "stop")
    return list(stop)


def check_template_kwargs(value: object) -> dict:
    """Extra chat template variables: an object of identifiers, none of which the gateway sets itself."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("chat_template_kwargs must be an object", "chat_template_kwargs")
    for name in value:
        if not isinstance(name, str) or not name.isidentifier():
            raise BadRequest(f"chat_template_kwargs: {name!r} is not a template variable name", "chat_template_kwargs")
        if name in TEMPLATE_OWN:
            raise BadRequest(f"chat_template_kwargs cannot set {name!r} (the gateway sets it)", "chat_template_kwargs")
    return dict(value)


def tool_call_dict(call: gateway_pb2.ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments or "{}"}}


def chat_call_from_proto(request: gateway_pb2.ChatRequest, vocab_size: int, context_length: int | None = None
                         ) -> ChatCall:
    if not request.messages:
        raise BadRequest("messages is empty", "messages")
    messages = []
    for i, m in enumerate(request.messages):
        if m.role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)} (got {m.role!r})",
                             f"messages[{i}].role")
        message: dict = {"role": m.role, "content": m.content}
        if m.tool_calls:
            if m.role != "assistant":
                raise BadRequest(f"messages[{i}]: only assistant messages carry tool_calls", f"messages[{i}]")
            message["tool_calls"] = [tool_call_dict(c) for c in m.tool_calls]
        for name in ("tool_call_id", "name", "reasoning_content"):
            if getattr(m, name):
                message[name] = getattr(m, name)
        messages.append(message)
    tools = []
    for i, tool in enumerate(request.tools):
        if not tool.name:
            raise BadRequest(f"tools[{i}].name is empty", f"tools[{i}].name")
        function: dict = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        if tool.parameters_json:
            try:
                function["parameters"] = json.loads(tool.parameters_json)
            except ValueError as exc:
                raise BadRequest(f"tools[{i}].parameters_json is not JSON: {exc}", f"tools[{i}]") from exc
        tools.append({"type": "function", "function": function})
    choice = request.tool_choice or "auto"
    if choice not in ("auto", "none"):
        raise BadRequest(f"tool_choice must be 'auto' or 'none' (got {choice!r})", "tool_choice")
    template_kwargs = {}
    if request.chat_template_kwargs_json:
        try:
            template_kwargs = json.loads(request.chat_template_kwargs_json)
        except ValueError as exc:
            raise BadRequest(f"chat_template_kwargs_json is not JSON: {exc}", "chat_template_kwargs") from exc
    parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
    return ChatCall(messages, tools or None, bool(tools) and choice == "auto",
                    check_sampling(request.sampling, vocab_size, context_length), check_stop(list(request.stop)),
                    check_template_kwargs(template_kwargs), parallel)
