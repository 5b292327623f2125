"""One chat call as the gateway runs it, whichever front end it came from: template-ready messages, tools, the
sampling parameters as applied and stop strings; with the checks shared by HTTP and gRPC, so that both accept and
refuse the same messages, tools and values."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from forge.gateway.errors import BadRequest
from forge.gateway.forced_calls import check_tool_choice
from forge.gateway.json_values import check_json, has_surrogate
from forge.sampling.bounds import schema_problem
from forge.sampling.grammar import Grammar
from forge.sampling.params import MAX_LOGIT_BIAS, MAX_PENALTY, MAX_TOP_LOGPROBS, repetition_problem, temperature_problem
from forge.tokenizer.tokenizer import NAMED_SPECIAL_TOKENS
from forge.v1 import common_pb2, gateway_pb2

ROLE_ALIASES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
WHOLE_TEXT_ROLES = ("system", "user", "tool")      # chat templates show these messages' content whole
MAX_SEED = 2**63
INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
# Variables the gateway itself gives the chat template: chat_template_kwargs may not replace them.
TEMPLATE_OWN = frozenset({"messages", "tools", "documents", "add_generation_prompt", *NAMED_SPECIAL_TOKENS})
PENALTIES = ("frequency_penalty", "presence_penalty")


@dataclass
class ChatCall:
    messages: list[dict]
    tools: list[dict] | None = None         # OpenAI tool dicts: {"type": "function", "function": {...}}
    parse_tools: bool = False               # parse tool calls out of the completion (tools given, choice not "none")
    sampling: common_pb2.SamplingParams = field(default_factory=common_pb2.SamplingParams)
    stop: list[str] = field(default_factory=list)
    template_kwargs: dict = field(default_factory=dict)    # extra chat template variables (chat_template_kwargs)
    parallel_tool_calls: bool = True        # False: at most one tool call is returned
    force_tool_call: bool = False           # tool_choice "required" or a named function: the answer opens a call
    forced_function: str | None = None      # the named function, if any
    grammar_param: str = "grammar"          # the request's field the grammar came in (its errors name it)


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


def check_text(text: str, where: str) -> str:
    if has_surrogate(text):
        raise BadRequest(f"{where} contains a lone surrogate (not valid Unicode text)", where)
    return text


def finite_number(value: object) -> bool:
    """A number (not a bool) that is a finite float: an integer too large for a float is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_int32(value: int, name: str) -> int:
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise BadRequest(f"{name} must be at most {INT32_MAX} in magnitude, got {value}", name)
    return value


def check_token_ids(ids: list[int], vocab_size: int, name: str) -> list[int]:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"{name} outside the vocabulary [0, {vocab_size}): {bad[:5]}", name)
    return ids


def chat_message(where: str, role: str, content: str | None, tool_calls: list[dict] | None = None,
                 extras: dict[str, str] | None = None, reasoning: str | None = None) -> dict:
    """A template-ready message: the role checked (``developer`` is ``system``), content required except on an
    assistant message, tool calls only on an assistant message, reasoning kept on assistant messages only."""
    canonical = ROLE_ALIASES.get(role)
    if canonical is None:
        raise BadRequest(f"{where}.role must be one of {', '.join(ROLE_ALIASES)} (got {role!r})", f"{where}.role")
    message: dict = {"role": canonical, "content": content}
    if canonical == "assistant":
        if tool_calls:
            message["tool_calls"] = tool_calls
        if reasoning:
            message["reasoning_content"] = reasoning
    else:
        if tool_calls:
            raise BadRequest(f"{where}: only assistant messages carry tool_calls", f"{where}.tool_calls")
        if content is None:
            raise BadRequest(f"{where}.content is required for role {role!r}", f"{where}.content")
    message.update({name: value for name, value in (extras or {}).items() if value})
    return message


def plain_message(role: object, content: object) -> dict | None:
    """What ``chat_message`` gives for a message of only a role and a text, without its per-message work (most
    messages are such); None where ``chat_message`` must read it."""
    canonical = ROLE_ALIASES.get(role) if type(role) is str else None
    return {"role": canonical, "content": content} if canonical is not None and type(content) is str else None


def tool_function(where: str, function: dict) -> dict:
    """A tool in OpenAI's form from its function part: a non-empty name, and parameters (if any) a JSON schema
    object."""
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise BadRequest(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
    if not isinstance(function.get("description"), str | None):
        raise BadRequest(f"{where}.function.description must be a string", f"{where}.function.description")
    if not isinstance(function.get("parameters"), dict | None):
        raise BadRequest(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
    if function.get("strict") and function.get("parameters") is not None:
        problem = schema_problem(function["parameters"])
        if problem:
            raise BadRequest(f"{where}.function.parameters (strict): {problem}", f"{where}.function.parameters")
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def check_sampling(sampling: common_pb2.SamplingParams, vocab_size: int, context_length: int | None = None,
                   grammar_param: str = "grammar") -> common_pb2.SamplingParams:
    """A checked copy with every default made explicit (temperature 1, top_p 1), as recorded in the pool. With
    ``context_length``, max_tokens and min_tokens must leave room for a prompt. A grammar's problems name
    ``grammar_param``, the field of the request it came from."""
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
    check_token_ids(list(sampling.stop_token_ids), vocab_size, "stop_token_ids")
    check_logit_edits(sampling, vocab_size, grammar_param)
    return checked


def penalty_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be the frequency or presence penalty ``name``, or None."""
    if -MAX_PENALTY <= value <= MAX_PENALTY:
        return None
    return f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value:.8g}"


def logit_bias_problem(token: int, bias: float, vocab_size: int) -> str | None:
    """Why token ``token`` cannot have the logit bias ``bias``, or None."""
    if not 0 <= token < vocab_size:
        return f"logit_bias: token id {token} is outside the vocabulary [0, {vocab_size})"
    if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
        return f"logit_bias: the bias of token {token} must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias:.8g}"
    return None


def grammar_problem(grammar: common_pb2.Grammar) -> str | None:
    """Why ``grammar`` is beyond the bounds of a grammar (``forge.sampling.bounds``), or None. Nothing is compiled
    here: the call's final grammar is compiled in the grammar sandbox before it is routed (``grammar_check``)."""
    kind = grammar.WhichOneof("kind")
    if kind == "json_object" and grammar.json_object:
        return None
    if kind not in ("json_schema", "lark"):
        return "a grammar needs json_schema, json_object or lark"
    return Grammar(kind, getattr(grammar, kind)).bounds_problem()


def check_logit_edits(sampling: common_pb2.SamplingParams, vocab_size: int, grammar_param: str = "grammar") -> None:
    """The penalties, logit_bias and grammar of ``sampling`` checked; a grammar's problems name ``grammar_param``,
    the field it came in."""
    for name in PENALTIES:
        problem = penalty_problem(name, getattr(sampling, name))
        if problem:
            raise BadRequest(problem, name)
    if sampling.repetition_penalty:                  # 0: unset, no penalty
        problem = repetition_problem(sampling.repetition_penalty)
        if problem:
            raise BadRequest(problem, "repetition_penalty")
    for token, bias in sorted(sampling.logit_bias.items()):
        problem = logit_bias_problem(token, bias, vocab_size)
        if problem:
            raise BadRequest(problem, "logit_bias")
    if not sampling.HasField("grammar"):
        return
    problem = grammar_problem(sampling.grammar)
    if problem:
        raise BadRequest(f"{grammar_param}: {problem}", grammar_param)
    if sampling.ignore_eos:
        raise BadRequest(f"ignore_eos cannot be combined with {grammar_param}: the output ends once it is complete",
                         "ignore_eos")
    if sampling.min_tokens:
        raise BadRequest(f"min_tokens cannot be combined with {grammar_param}: once the output is complete only the "
                         "end of sequence may follow, which min_tokens would ban", "min_tokens")


def check_grammar_with_tools(sampling: common_pb2.SamplingParams, tools: list[dict] | None, mode: str,
                             grammar_param: str) -> None:
    """Refuse a response format (sent as ``grammar_param``) with a forced tool call: the call's arguments follow
    the tool's parameters and cannot also be the reply's document. (With ``tool_choice`` auto the reply is either,
    see ``forge.gateway.tool_grammar``.)"""
    if sampling.HasField("grammar") and tools and mode == "required":
        raise BadRequest(f"{grammar_param} cannot be combined with a forced tool call (tool_choice 'required' or a "
                         f"named function): the call's arguments follow the tool's parameters and cannot also follow "
                         f"{grammar_param}", grammar_param)


def check_stop(stop: list[str], param: str = "stop") -> list[str]:
    """Stop strings checked; an error names ``param``, the field they came in."""
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequest(f"at most {MAX_STOP_STRINGS} stop strings (got {len(stop)})", param)
    if any(not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise BadRequest(f"stop strings must be non-empty strings of at most {MAX_STOP_CHARS} characters", param)
    for s in stop:
        check_text(s, param)
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


def message_from_proto(index: int, message: gateway_pb2.ChatMessage) -> dict:
    if not (message.tool_calls or message.tool_call_id or message.name or message.reasoning_content):
        plain = plain_message(message.role, message.content)
        if plain is not None:
            return plain
    return chat_message(f"messages[{index}]", message.role, message.content,
                        [tool_call_dict(c) for c in message.tool_calls],
                        {"tool_call_id": message.tool_call_id, "name": message.name}, message.reasoning_content)


def chat_call_from_proto(request: gateway_pb2.ChatRequest, vocab_size: int, context_length: int | None = None
                         ) -> ChatCall:
    if not request.messages:
        raise BadRequest("messages is empty", "messages")
    messages = [message_from_proto(i, m) for i, m in enumerate(request.messages)]
    tools = []
    for i, tool in enumerate(request.tools):
        function: dict = {"name": tool.name, "description": tool.description or None}
        if tool.parameters_json:
            try:
                function["parameters"] = json.loads(tool.parameters_json)
            except ValueError as exc:
                raise BadRequest(f"tools[{i}].parameters_json is not JSON: {exc}", f"tools[{i}].parameters_json"
                                 ) from exc
            except RecursionError as exc:
                raise BadRequest(f"tools[{i}].parameters_json is nested too deeply", f"tools[{i}].parameters_json"
                                 ) from exc
            check_json(function["parameters"], f"tools[{i}].parameters_json")
        tools.append(tool_function(f"tools[{i}]", function))
    choice = request.tool_choice or "auto"
    if choice not in ("auto", "none", "required"):          # else the name of a function among the tools
        choice = {"type": "function", "function": {"name": choice}}
    mode, function = check_tool_choice(choice, tools)
    template_kwargs = {}
    if request.chat_template_kwargs_json:
        try:
            template_kwargs = json.loads(request.chat_template_kwargs_json)
        except ValueError as exc:
            raise BadRequest(f"chat_template_kwargs_json is not JSON: {exc}", "chat_template_kwargs") from exc
        except RecursionError as exc:
            raise BadRequest("chat_template_kwargs_json is nested too deeply", "chat_template_kwargs") from exc
        check_json(template_kwargs, "chat_template_kwargs_json")
    parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
    sampling = check_sampling(request.sampling, vocab_size, context_length)
    check_grammar_with_tools(sampling, tools, mode, "grammar")
    return ChatCall(messages, tools or None, bool(tools) and mode != "none", sampling, check_stop(list(request.stop)),
                    check_template_kwargs(template_kwargs), parallel, mode == "required", function)
