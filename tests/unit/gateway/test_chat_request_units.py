"""Chat requests checked without processes: OpenAI bodies and the gRPC ChatRequest into a chat call (the field a
bad value names, extensions, sampling edits and grammars), forced tool calls and their openers."""

from __future__ import annotations

import json

import pytest

from forge.gateway.errors import BadRequest
from forge.gateway.forced_calls import check_tool_choice, tool_call_opener
from forge.gateway.http.openai import parse_chat_request
from forge.gateway.messages import chat_call_from_proto
from forge.v1 import common_pb2, gateway_pb2

from helpers.tiny_text import TOK, TOOLS


def test_openai_request_is_checked_into_a_chat_call():
    body = {"model": "x", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                                       {"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": None, "tool_calls": [
                                           {"id": "c1", "type": "function",
                                            "function": {"name": "add", "arguments": "{}"}}]},
                                       {"role": "tool", "tool_call_id": "c1", "content": "3"}],
            "tools": TOOLS, "max_completion_tokens": 7, "temperature": 0.5, "seed": 3, "stop": "END",
            "stream": True, "stream_options": {"include_usage": True}, "logprobs": True}
    call, options = parse_chat_request(body, 1024)
    assert call.messages[0] == {"role": "system", "content": "be brief"} and call.parse_tools
    assert call.messages[2]["tool_calls"][0]["function"]["name"] == "add"
    assert (call.sampling.max_tokens, call.sampling.temperature, call.sampling.seed, call.sampling.top_p) == \
        (7, 0.5, 3, 1.0)
    assert call.stop == ["END"] and options.stream and options.include_usage and options.logprobs
    assert not parse_chat_request({**body, "tool_choice": "none"}, 1024)[0].parse_tools


@pytest.mark.parametrize("change, param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": 1e-39}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": -5}, "seed"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"stop": ["", "x"]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tool_choice": "required"}, "tool_choice"),              # without tools
    ({"tool_choice": {"type": "function", "function": {"name": "add"}}}, "tool_choice"),
    ({"tool_choice": "any"}, "tool_choice"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.0000001}, "frequency_penalty"),
    ({"frequency_penalty": True}, "frequency_penalty"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.01}, "repetition_penalty"),
    ({"repetition_penalty": 1e-50}, "repetition_penalty"),
    ({"repetition_penalty": 0.005}, "repetition_penalty"),
    ({"logit_bias": {"1024": 1}}, "logit_bias"),
    ({"logit_bias": {"05": 1}}, "logit_bias"),
    ({"logit_bias": {" 5": 1}}, "logit_bias"),
    ({"logit_bias": {"\u0665": 1}}, "logit_bias"),          # an Arabic-Indic five: int() takes it, OpenAI not
    ({"logit_bias": {"9" * 5000: 1}}, "logit_bias"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias"),
    ({"logit_bias": {"5": 10**400}}, "logit_bias"),
    ({"logit_bias": {"5": None}}, "logit_bias"),
    ({"logit_bias": "5"}, "logit_bias"),
    ({"min_p": 0.05}, "min_p"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}},
     "response_format"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ({"response_format": {"type": "json_object"}, "tools": TOOLS, "tool_choice": "required"}, "response_format"),
    ({"response_format": "json_object"}, "response_format"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"stream": "yes"}, "stream"),
    ({"model": 7}, "model"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"reasoning_effort": 2}, "reasoning_effort"),
    ({"audio": {"voice": "alloy"}}, "audio"),
])
def test_bad_openai_requests_name_the_field(change, param):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(BadRequest) as err:
        parse_chat_request(body, 1024)
    assert err.value.param == param and err.value.status == 400 and err.value.message


def test_openai_extensions_reach_the_chat_call():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "min_tokens": 3, "logprobs": True,
            "top_logprobs": 4, "chat_template_kwargs": {"enable_thinking": False}, "parallel_tool_calls": False,
            "repetition_penalty": 1, "min_p": 0, "logit_bias": {}, "guided_json": None}
    call, options = parse_chat_request(body, 1024, context_length=2048)
    assert (call.sampling.min_tokens, call.sampling.top_logprobs, options.logprobs) == (3, 4, True)
    assert call.template_kwargs == {"enable_thinking": False} and not call.parallel_tool_calls
    assert parse_chat_request({"messages": body["messages"]}, 1024)[0].parallel_tool_calls
    for name in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(BadRequest) as err:
            parse_chat_request({"messages": body["messages"], name: 2048}, 1024, context_length=2048)
        assert (err.value.param, err.value.code) == (name, "context_length_exceeded")


def test_logit_bias_penalties_and_response_format_reach_the_sampling_parameters():
    body = {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"0": -100, "1023": 100, "7": 0.5},
            "frequency_penalty": -2, "presence_penalty": 2, "repetition_penalty": 0.25,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                       "strict": True, "description": "an x"}}}
    sampling = parse_chat_request(body, 1024)[0].sampling
    assert dict(sampling.logit_bias) == {0: -100.0, 1023: 100.0, 7: 0.5}
    assert (sampling.frequency_penalty, sampling.presence_penalty, sampling.repetition_penalty) == (-2, 2, 0.25)
    assert sampling.grammar == common_pb2.Grammar(json_schema=json.dumps({"type": "object"}))
    anything = {"messages": body["messages"], "response_format": {"type": "json_object"}, "repetition_penalty": 1,
                "tools": TOOLS, "tool_choice": "none"}
    sampling = parse_chat_request(anything, 1024)[0].sampling
    assert sampling.grammar == common_pb2.Grammar(json_object=True) and sampling.repetition_penalty == 0
    for text in ({"type": "text"}, {}, None):
        assert not parse_chat_request({"messages": body["messages"], "response_format": text},
                                      1024)[0].sampling.HasField("grammar")


def test_a_schema_nested_too_deeply_for_python_is_a_bad_request():
    schema = {}
    for _ in range(5000):
        schema = {"properties": {"a": schema}}
    with pytest.raises(BadRequest) as err:
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}}, 1024)
    assert err.value.param == "response_format" and "nested too deeply" in err.value.message
    deep = '{"properties": {"a": ' * 600 + "{}" + "}}" * 600
    with pytest.raises(BadRequest) as err:
        chat_call_from_proto(gateway_pb2.ChatRequest(
            messages=[gateway_pb2.ChatMessage(role="user", content="hi")],
            sampling=common_pb2.SamplingParams(grammar=common_pb2.Grammar(json_schema=deep))), 1024)
    assert err.value.param == "grammar"


def test_fields_that_change_nothing_are_accepted_and_ignored():
    """What OpenAI's clients send for storage, billing, caching and moderation changes nothing that is sampled: the
    call is the one the bare request makes."""
    bare = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0.7}
    harmless = {"store": False, "metadata": {"run": "a"}, "service_tier": "auto", "prompt_cache_key": "k",
                "safety_identifier": "u1", "verbosity": "low", "modalities": ["text"], "user": "me"}
    call, options = parse_chat_request({**bare, **harmless}, 1024)
    expected, expected_options = parse_chat_request(bare, 1024)
    assert call == expected and options == expected_options


def test_reasoning_effort_reaches_the_chat_template():
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}
    assert parse_chat_request(body, 1024)[0].template_kwargs == {"reasoning_effort": "low"}
    own = {**body, "chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": True}}
    assert parse_chat_request(own, 1024)[0].template_kwargs == {"reasoning_effort": "high", "enable_thinking": True}


# Qwen3's layout of a tool call: the block on lines of its own (the newline after a block tag is trimmed, as
# transformers renders templates).
QWEN_STYLE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
              "{% for c in m.tool_calls or [] %}\n<tool_call>\n{\"name\": {{ c.function.name | tojson }}, "
              "\"arguments\": {{ c.function.arguments }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template, required, named", [
    (None, '<tool_call>{"name": ', '<tool_call>{"name": "add", "arguments": '),
    (QWEN_STYLE, '<tool_call>\n{"name": ', '<tool_call>\n{"name": "add", "arguments": '),
])
def test_a_forced_tool_calls_opener_is_the_templates_own_layout(template, required, named):
    from forge.tokenizer.chat_template import render_chat

    messages = [{"role": "user", "content": "add 2 and 3"}]

    def render(conversation, add_generation_prompt):
        if template is None:
            return TOK.render_chat(conversation, TOOLS, add_generation_prompt=add_generation_prompt)
        return render_chat(template, conversation, tools=TOOLS, add_generation_prompt=add_generation_prompt)

    prompt = render(messages, True)
    assert tool_call_opener(render, messages, prompt, None, TOOLS) == required
    assert tool_call_opener(render, messages, prompt, "add", TOOLS) == named
    # What the model then writes completes the template's own rendering of the call, which parses.
    whole = render([*messages, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]}], False)
    assert whole.startswith(prompt + named + '{"a": 2}')


def test_a_template_that_does_not_show_tool_calls_cannot_force_one():
    messages = [{"role": "user", "content": "hi"}]
    from forge.tokenizer.chat_template import render_chat

    def render(conversation, add_generation_prompt):
        return render_chat("{% for m in messages %}{{ m.content }}{% endfor %}", conversation)

    with pytest.raises(BadRequest, match="tool-call layout could not be read"):
        tool_call_opener(render, messages, render(messages, True), "add", TOOLS)


def test_tool_choice_forms():
    assert check_tool_choice(None, TOOLS) == ("auto", None)
    assert check_tool_choice("none", None) == ("none", None)
    assert check_tool_choice("required", TOOLS) == ("required", None)
    assert check_tool_choice({"type": "function", "function": {"name": "add"}}, TOOLS) == ("required", "add")
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    call = parse_chat_request({**body, "tool_choice": {"type": "function", "function": {"name": "add"}}}, 1024)[0]
    assert call.force_tool_call and call.forced_function == "add" and call.parse_tools
    proto = gateway_pb2.ChatRequest(messages=[gateway_pb2.ChatMessage(role="user", content="hi")],
                                    tools=[gateway_pb2.Tool(name="add")], tool_choice="add")
    assert chat_call_from_proto(proto, 1024).forced_function == "add"


def test_proto_chat_request_is_checked():
    request = gateway_pb2.ChatRequest(session_id="s", messages=[gateway_pb2.ChatMessage(role="user", content="hi")],
                                      tools=[gateway_pb2.Tool(name="add", parameters_json='{"type": "object"}')],
                                      sampling=common_pb2.SamplingParams(max_tokens=3))
    call = chat_call_from_proto(request, 1024)
    assert call.parse_tools and call.tools[0]["function"]["parameters"] == {"type": "object"}
    assert call.sampling.temperature == 1.0 and call.sampling.HasField("temperature")
    for bad in (gateway_pb2.ChatRequest(session_id="s"),
                gateway_pb2.ChatRequest(messages=[gateway_pb2.ChatMessage(role="bot", content="x")]),
                gateway_pb2.ChatRequest(messages=request.messages, tools=[gateway_pb2.Tool(name="a",
                                                                                           parameters_json="{")]),
                gateway_pb2.ChatRequest(messages=request.messages, sampling=common_pb2.SamplingParams(top_p=2)),
                gateway_pb2.ChatRequest(messages=request.messages,
                                        sampling=common_pb2.SamplingParams(stop_token_ids=[5000])),
                gateway_pb2.ChatRequest(messages=request.messages, tool_choice="required")):
        with pytest.raises(BadRequest):
            chat_call_from_proto(bad, 1024)


def test_proto_sampling_edits_and_grammars_are_checked_as_over_http():
    """The same values pass and fail over gRPC as over HTTP, with the same messages."""
    messages = [gateway_pb2.ChatMessage(role="user", content="hi")]
    good = common_pb2.SamplingParams(logit_bias={0: -100, 1023: 100}, frequency_penalty=-2, presence_penalty=2,
                                     repetition_penalty=2, grammar=common_pb2.Grammar(json_schema='{"type": "object"}'))
    checked = chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages, sampling=good), 1024).sampling
    assert (checked.logit_bias, checked.repetition_penalty, checked.grammar) == (good.logit_bias, 2, good.grammar)
    lowest = common_pb2.SamplingParams(repetition_penalty=0.01)      # arrives as float32 0.0099999998
    assert chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages, sampling=lowest), 1024)
    for change, param, body in (
            ({"logit_bias": {1024: 1}}, "logit_bias", {"logit_bias": {"1024": 1}}),
            ({"logit_bias": {5: 101}}, "logit_bias", {"logit_bias": {"5": 101}}),
            ({"frequency_penalty": 3}, "frequency_penalty", {"frequency_penalty": 3}),
            ({"presence_penalty": -3}, "presence_penalty", {"presence_penalty": -3}),
            ({"repetition_penalty": 4}, "repetition_penalty", {"repetition_penalty": 4}),
            ({"repetition_penalty": 2**-8}, "repetition_penalty", {"repetition_penalty": 2**-8}),
            ({"grammar": common_pb2.Grammar(json_object=True), "ignore_eos": True}, "ignore_eos",
             {"response_format": {"type": "json_object"}, "ignore_eos": True}),
            ({"grammar": common_pb2.Grammar(json_object=True), "min_tokens": 3}, "min_tokens",
             {"response_format": {"type": "json_object"}, "min_tokens": 3})):
        with pytest.raises(BadRequest) as over_grpc:
            chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages,
                                                         sampling=common_pb2.SamplingParams(**change)), 1024)
        with pytest.raises(BadRequest) as over_http:
            parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, 1024)
        assert over_grpc.value.param == over_http.value.param == param
        assert over_grpc.value.message.replace("response_format", "grammar") == over_http.value.message.replace(
            "response_format", "grammar")
    # Grammars beyond the bounds are refused here; ones that do not compile (lark "start: x") are refused by the
    # grammar sandbox before routing (tests/integration/gateway/test_gateway_sampling.py).
    for grammar in (common_pb2.Grammar(), common_pb2.Grammar(json_object=False), common_pb2.Grammar(json_schema="[]"),
                    common_pb2.Grammar(json_schema=""), common_pb2.Grammar(json_schema='{"minItems": 100000}')):
        with pytest.raises(BadRequest) as err:
            chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages,
                                                         sampling=common_pb2.SamplingParams(grammar=grammar)), 1024)
        assert err.value.param == "grammar"
    tools = [gateway_pb2.Tool(name="add")]
    for choice in ("required", "add"):
        with pytest.raises(BadRequest, match="grammar cannot be combined"):
            chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages, tools=tools, tool_choice=choice,
                                                         sampling=good), 1024)
    for choice in ("none", "", "auto"):         # auto: the document or a call (see forge.gateway.tool_grammar)
        assert chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages, tools=tools, tool_choice=choice,
                                                            sampling=good), 1024).sampling.HasField("grammar")
    lark = common_pb2.SamplingParams(grammar=common_pb2.Grammar(lark='start: "yes" | "no"'))
    assert chat_call_from_proto(gateway_pb2.ChatRequest(messages=messages, sampling=lark), 1024).sampling.grammar.lark
