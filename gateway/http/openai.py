"""OpenAI's chat-completions wire format: a request body checked field by field into a ``ChatCall`` (each bad
field named in the error), and the response objects (``chat.completion``, ``chat.completion.chunk``)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.gateway.calls import ChatDelta, ChatResult
from forge.gateway.errors import BadRequest
from forge.gateway.forced_calls import check_tool_choice
from forge.gateway.http.json_schemas import json_object_grammar, named_schema_grammar
from forge.gateway.http.openai_messages import parse_messages
from forge.gateway.http.wire import Answering, Event, StreamWriter, WireFormat, forge_json
from forge.gateway.messages import (
    PENALTIES,
    ChatCall,
    check_grammar_with_tools,
    check_int32,
    check_sampling,
    check_stop,
    check_template_kwargs,
    check_token_ids,
    finite_number,
    logit_bias_problem,
    penalty_problem,
    repetition_problem,
    tool_function,
)
from forge.gateway.modelinfo import ModelInfo
from forge.sampling.params import temperature_problem
from forge.v1 import common_pb2

# The request fields the gateway implements (OpenAI's and vLLM's names); every other field is refused.
SUPPORTED = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
    "stop_token_ids", "ignore_eos", "min_tokens", "n", "stream", "stream_options", "logprobs", "top_logprobs",
    "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "response_format", "return_token_ids",
    "reasoning_effort", "modalities", "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty"})
# Fields the gateway accepts and ignores, as vLLM does: they ask OpenAI's service for storage, billing, caching or
# moderation, and change nothing that is sampled.
IGNORED = frozenset({"user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier",
                     "verbosity"})
MAX_SAMPLES = 128                  # n: answers to one prompt
# Fields accepted at the value that changes nothing (or null), refused at any other.
NEUTRAL = {"min_p": 0}
RECORDED = "sampling must stay what the learner recomputes the log-probabilities under"
STRUCTURED = ("structured output is asked for with response_format ({'type': 'json_schema', 'json_schema': "
              "{'name': ..., 'schema': ...}} or {'type': 'json_object'}); no other grammar is compiled")
WHY_NOT = {
    **dict.fromkeys(NEUTRAL, RECORDED),
    **dict.fromkeys(("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                     "guided_whitespace_pattern", "structured_outputs"), STRUCTURED),
    **dict.fromkeys(("logits_processors", "bad_words", "allowed_token_ids"), RECORDED),
    **dict.fromkeys(("best_of", "use_beam_search", "length_penalty"), "one sample per request, no beam search"),
}
# A logit_bias key: a token id in decimal, without sign or leading zeros (so that no two keys name one token).
TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,9}")


@dataclass
class ChatOptions:
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    return_token_ids: bool = False
    n: int = 1                      # answers to the prompt, each a call of the session


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def field_value(body: dict, name: str, kind: str, default: Any = None) -> Any:
    """``body[name]`` checked to be of ``kind`` (bool, int, number, str, list, dict); ``default`` when absent or
    null."""
    value = body.get(name)
    if value is None:
        return default
    ok = {"bool": lambda v: isinstance(v, bool), "int": _is_int, "number": _is_number,
          "str": lambda v: isinstance(v, str), "list": lambda v: isinstance(v, list),
          "dict": lambda v: isinstance(v, dict)}[kind](value)
    if not ok:
        article = "an" if kind == "int" else "a"
        raise BadRequest(f"{name} must be {article} {kind}, got {type(value).__name__}", name)
    if kind == "number" and not finite_number(value):
        raise BadRequest(f"{name} must be a finite number", name)
    return value


def read_tools(body: dict, read_one: Callable[[str, Any], dict]) -> list[dict] | None:
    """The request's ``tools``, each checked and read by ``read_one(where, tool)`` into a chat-completions function
    tool: None when there are none."""
    tools = field_value(body, "tools", "list")
    return [read_one(f"tools[{i}]", tool) for i, tool in enumerate(tools)] if tools else None


def parse_tools(body: dict) -> list[dict] | None:
    return read_tools(body, _function_tool)


def _function_tool(where: str, tool: Any) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
        raise BadRequest(f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}",
                         where)
    return tool_function(where, function)


def refuse_unsupported(body: dict, supported: frozenset[str] = SUPPORTED, ignored: frozenset[str] = IGNORED,
                       why_not: dict[str, str] = WHY_NOT, neutral: dict[str, Any] = NEUTRAL) -> None:
    """A 400 naming the first field of ``body`` that is neither ``supported`` nor ``ignored`` (nor at its
    ``neutral`` value), with the reason ``why_not`` gives; a null counts as absent. The defaults are chat
    completions'; every wire format checks its body with its own sets."""
    for name, value in body.items():
        if name in supported or name in ignored or value is None:
            continue
        if name in neutral and value == neutral[name] and not isinstance(value, bool):
            continue
        reason = why_not.get(name)
        raise BadRequest(f"{name} is not supported" + (f": {reason}" if reason else " by this gateway"), name)


def parse_stop(body: dict) -> list[str]:
    """``stop``: a string or a list of strings, checked."""
    stop = body.get("stop")
    if stop is None:
        return []
    if not isinstance(stop, str | list):
        raise BadRequest("stop must be a string or a list of strings", "stop")
    return check_stop([stop] if isinstance(stop, str) else stop)


def response_format_grammar(body: dict) -> common_pb2.Grammar | None:
    """The grammar ``response_format`` asks for: None for text (the default), any JSON object for
    ``json_object``, the schema of ``json_schema``."""
    form = field_value(body, "response_format", "dict")
    kind = "text" if form is None else form.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise BadRequest(f"response_format type {kind!r} is not supported: 'text', 'json_object' or 'json_schema'",
                         "response_format")
    spec = form.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest("response_format.json_schema is required with type 'json_schema': {'name': ..., "
                         "'schema': {...}}", "response_format")
    return named_schema_grammar(spec, "response_format", "response_format.json_schema")


def parse_logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    """``logit_bias``: token ids (decimal strings, as OpenAI's clients send them) to biases in [-100, 100]."""
    biases = {}
    for key, value in field_value(body, "logit_bias", "dict", {}).items():
        if not TOKEN_ID.fullmatch(key):
            raise BadRequest(f"logit_bias: {key!r} is not a token id in [0, {vocab_size})", "logit_bias")
        if not finite_number(value):
            raise BadRequest(f"logit_bias: the bias of token {key} must be a number, got {value!r}", "logit_bias")
        problem = logit_bias_problem(int(key), value, vocab_size)
        if problem:
            raise BadRequest(problem, "logit_bias")
        biases[int(key)] = float(value)
    return biases


def parse_penalties(body: dict, sampling: common_pb2.SamplingParams) -> None:
    """The frequency, presence and repetition penalties into ``sampling``, checked as sent (before their float32
    rounding); a repetition penalty of 1 is none, and is left unset."""
    for name in PENALTIES:
        value = field_value(body, name, "number", 0)
        problem = penalty_problem(name, value)
        if problem:
            raise BadRequest(problem, name)
        setattr(sampling, name, value)
    repetition = field_value(body, "repetition_penalty", "number", 1)
    problem = repetition_problem(repetition)
    if problem:
        raise BadRequest(problem, "repetition_penalty")
    if repetition != 1:
        sampling.repetition_penalty = repetition


def parse_sampling(body: dict, vocab_size: int, context_length: int | None = None,
                   grammar: common_pb2.Grammar | None = None, grammar_param: str = "grammar"
                   ) -> common_pb2.SamplingParams:
    """The sampling parameters of ``body`` (OpenAI's and vLLM's names), with ``grammar`` (sent as
    ``grammar_param``), checked."""
    sampling = common_pb2.SamplingParams()
    temperature = field_value(body, "temperature", "number")
    if temperature is not None:
        problem = temperature_problem(temperature)     # before float32 rounding: 1e-50 is no greedy 0
        if problem:
            raise BadRequest(problem, "temperature")
        sampling.temperature = temperature
    top_p = field_value(body, "top_p", "number")
    if top_p is not None:
        sampling.top_p = top_p if 0 < top_p <= 1 else 0.0
        if sampling.top_p == 0.0:                      # out of range, or too small for float32 (0 would mean 1)
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = field_value(body, "top_k", "int", 0)
    if top_k < -1:
        raise BadRequest(f"top_k must be >= 0 (or -1 for off), got {top_k}", "top_k")
    sampling.top_k = max(check_int32(top_k, "top_k"), 0)
    for name in ("max_completion_tokens", "max_tokens"):
        value = field_value(body, name, "int")
        if value is not None:
            if value < 1:
                raise BadRequest(f"{name} must be >= 1, got {value}", name)
            if context_length is not None and value >= context_length:
                raise BadRequest(f"{name} is {value}; the model's context is {context_length} tokens, prompt "
                                 "included", name, "context_length_exceeded")
            sampling.max_tokens = min(value, 2**31 - 1)
            break
    seed = field_value(body, "seed", "int")
    if seed is not None:
        if not 0 <= seed < 2**63:
            raise BadRequest(f"seed must be in [0, 2**63), got {seed}", "seed")
        sampling.seed = seed
    stop_ids = field_value(body, "stop_token_ids", "list", [])
    if not all(_is_int(t) for t in stop_ids):
        raise BadRequest("stop_token_ids must be a list of token ids", "stop_token_ids")
    sampling.stop_token_ids.extend(check_token_ids(stop_ids, vocab_size, "stop_token_ids"))
    sampling.ignore_eos = field_value(body, "ignore_eos", "bool", False)
    min_tokens = field_value(body, "min_tokens", "int", 0)
    if not 0 <= min_tokens < 2**31:
        raise BadRequest(f"min_tokens must be >= 0, got {min_tokens}", "min_tokens")
    sampling.min_tokens = min_tokens
    top_logprobs = field_value(body, "top_logprobs", "int", 0)
    if top_logprobs and not field_value(body, "logprobs", "bool", False):
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    if not 0 <= top_logprobs < 2**31:
        raise BadRequest(f"top_logprobs must be >= 0, got {top_logprobs}", "top_logprobs")
    sampling.top_logprobs = top_logprobs
    parse_penalties(body, sampling)
    sampling.logit_bias.update(parse_logit_bias(body, vocab_size))
    if grammar is not None:
        sampling.grammar.CopyFrom(grammar)
    return check_sampling(sampling, vocab_size, context_length, grammar_param)


def template_kwargs(body: dict) -> dict:
    """The chat template's extra variables: ``chat_template_kwargs``, with ``reasoning_effort`` among them (as vLLM
    passes it) unless those set it themselves."""
    kwargs = check_template_kwargs(field_value(body, "chat_template_kwargs", "dict"))
    effort = field_value(body, "reasoning_effort", "str")
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
    return kwargs


def parse_chat_request(body: Any, vocab_size: int, context_length: int | None = None
                       ) -> tuple[ChatCall, ChatOptions]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    refuse_unsupported(body)
    field_value(body, "model", "str")
    messages = parse_messages(body.get("messages"))
    n = field_value(body, "n", "int", 1)
    if not 1 <= n <= MAX_SAMPLES:
        raise BadRequest(f"n must be in [1, {MAX_SAMPLES}], got {n}", "n")
    grammar = response_format_grammar(body)
    tools = parse_tools(body)
    mode, function = check_tool_choice(body.get("tool_choice"), tools)
    modalities = field_value(body, "modalities", "list", ["text"])
    if modalities != ["text"]:
        raise BadRequest(f"modalities must be [\"text\"] (got {modalities!r}): the model writes text only",
                         "modalities")
    stream_options = field_value(body, "stream_options", "dict", {})
    options = ChatOptions(stream=field_value(body, "stream", "bool", False),
                          include_usage=bool(stream_options.get("include_usage")),
                          logprobs=field_value(body, "logprobs", "bool", False),
                          return_token_ids=field_value(body, "return_token_ids", "bool", False), n=n)
    sampling = parse_sampling(body, vocab_size, context_length, grammar, "response_format")
    check_grammar_with_tools(sampling, tools, mode, "response_format")
    call = ChatCall(messages, tools, bool(tools) and mode != "none", sampling, parse_stop(body), template_kwargs(body),
                    field_value(body, "parallel_tool_calls", "bool", True), mode == "required", function, "response_format")
    return call, options


# ---------------------------------------------------------------------------------------------- responses


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def finish_name(result: ChatResult) -> str:
    if result.finish_reason == common_pb2.FINISH_REASON_LENGTH and not result.stopped_by_string:
        return "length"
    return "tool_calls" if result.parsed and result.parsed.tool_calls else "stop"


def token_json(model: ModelInfo, token_id: int, logprob: float) -> dict:
    raw = model.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def logprobs_json(model: ModelInfo, ids: list[int], logprobs: list[float],
                  tops: list[common_pb2.TopLogprobs] | None = None) -> dict:
    content = []
    for i, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        top = tops[i] if tops and i < len(tops) else None
        alternatives = [] if top is None else [token_json(model, t, v)
                                               for t, v in zip(top.token_ids, top.logprobs, strict=True)]
        content.append({**token_json(model, token_id, logprob), "top_logprobs": alternatives})
    return {"content": content, "refusal": None}


def message_json(result: ChatResult) -> dict:
    parsed = result.parsed
    message: dict = {"role": "assistant", "content": parsed.content or (None if parsed.tool_calls else "")}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
    return message


def usage_of(results: list[ChatResult]) -> dict:
    """The usage of a request's answers: its prompt once, every answer's tokens."""
    prompt = len(results[0].prompt_ids)
    completion = sum(len(result.completion_ids) for result in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def forge_of(results: list[ChatResult]) -> dict:
    """Forge's object: the session and the first answer's call (with several, every answer's call index)."""
    body = forge_json(results[0])
    if len(results) > 1:
        body["call_indexes"] = [result.call_index for result in results]
    return body


def completion_json(results: list[ChatResult], model: ModelInfo, model_name: str, options: ChatOptions) -> dict:
    choices = []
    for index, result in enumerate(results):
        choice: dict = {"index": index, "message": message_json(result), "finish_reason": finish_name(result),
                        "logprobs": logprobs_json(model, result.completion_ids, result.all_logprobs,
                                                  result.all_top_logprobs) if options.logprobs else None}
        if options.return_token_ids:
            choice["token_ids"] = result.completion_ids
        choices.append(choice)
    body = {"id": new_completion_id(), "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "choices": choices, "usage": usage_of(results), "system_fingerprint": None,
            "forge": forge_of(results)}
    if options.return_token_ids:
        body["prompt_token_ids"] = results[0].prompt_ids
    return body


class ChunkWriter(StreamWriter):
    """``chat.completion.chunk`` objects of one streamed answer (choice ``index``, of completion ``completion_id``);
    ``ChatCompletions.closing`` ends the stream (usage, ``[DONE]``)."""

    def __init__(self, model: ModelInfo, model_name: str, options: ChatOptions, index: int = 0,
                 completion_id: str | None = None) -> None:
        self.model = model
        self.options = options
        self.index = index
        self.base = {"id": completion_id or new_completion_id(), "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model_name, "system_fingerprint": None}

    def chunk(self, delta: dict, finish_reason: str | None = None, event: ChatDelta | None = None) -> dict:
        choice: dict = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if event is not None and self.options.logprobs and event.token_ids:
            choice["logprobs"] = logprobs_json(self.model, event.token_ids, event.logprobs, event.top_logprobs)
        if event is not None and self.options.return_token_ids:
            choice["token_ids"] = event.token_ids
        body = {**self.base, "choices": [choice]}
        if self.options.include_usage:
            body["usage"] = None
        return body

    def first(self) -> list[Event]:
        return [Event(self.chunk({"role": "assistant", "content": ""}))]

    def deltas(self, delta: ChatDelta) -> list[Event]:
        return [Event(chunk) for chunk in self._delta_chunks(delta)]

    def _delta_chunks(self, event: ChatDelta) -> list[dict]:
        delta = {}
        if event.reasoning:
            delta["reasoning_content"] = event.reasoning
        if event.content:
            delta["content"] = event.content
        wants_ids = self.options.logprobs or self.options.return_token_ids
        if not delta and not (wants_ids and event.token_ids):
            return []
        return [self.chunk(delta, event=event)]

    def final(self, result: ChatResult) -> list[Event]:
        chunks = self._delta_chunks(result)
        for i, call in enumerate(result.parsed.tool_calls):
            chunks.append(self.chunk({"tool_calls": [{"index": i, **call.to_openai()}]}))
        last = self.chunk({}, finish_name(result))
        last["forge"] = forge_json(result)
        if self.options.return_token_ids:
            last["prompt_token_ids"] = result.prompt_ids
        chunks.append(last)
        return [Event(chunk) for chunk in chunks]


class ChatCompletions(WireFormat):
    """OpenAI's ``POST /v1/chat/completions``."""

    name = "chat.completions"

    def parse(self, body: dict, vocab_size: int, context_length: int | None) -> tuple[ChatCall, ChatOptions]:
        return parse_chat_request(body, vocab_size, context_length)

    def samples(self, options: ChatOptions) -> int:
        return options.n

    def answer(self, result: ChatResult, answering: Answering, options: ChatOptions) -> dict:
        return completion_json([result], answering.model, answering.model_name, options)

    def answer_samples(self, results: list[ChatResult], answering: Answering, options: ChatOptions) -> dict:
        return completion_json(results, answering.model, answering.model_name, options)

    def writer(self, answering: Answering, options: ChatOptions) -> ChunkWriter:
        return ChunkWriter(answering.model, answering.model_name, options)

    def sample_writers(self, answering: Answering, options: ChatOptions, count: int) -> list[StreamWriter]:
        completion_id = new_completion_id()
        return [ChunkWriter(answering.model, answering.model_name, options, index, completion_id)
                for index in range(count)]

    def closing(self, writers: list[StreamWriter], results: list[ChatResult], options: ChatOptions) -> list[Event]:
        usage = [Event({**writers[0].base, "choices": [], "usage": usage_of(results)})]
        return [*(usage if options.include_usage else []), Event(None)]
