"""Sampling edits (logit_bias, frequency, presence and repetition penalties) and structured output (a JSON schema,
any JSON object) through a real gateway: what each API sends reaches the actor as the proto's fields and is
recorded so, every bad value is refused by name before the actor hears of it, and a grammar with tool calls it
would forbid is refused. Against a random-weight actor, a constrained call's answer follows its schema and the
learner recomputes what the actor recorded."""

from __future__ import annotations

import json

import anthropic
import grpc
import httpx
import openai
import pytest
import torch

from forge.assets import TINY_DIR
from forge.pool import PoolReader
from forge.tokenizer import Tokenizer
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway
from helpers.recompute import learner_and_recorded

TOK = Tokenizer.from_dir(TINY_DIR)
ANSWER = '{"city": "Oslo"}'
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"],
          "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Where is it?"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
ANTHROPIC_TOOLS = [{"name": "lookup", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """A gateway in front of a fake actor that answers every prompt with ``ANSWER`` and keeps what it was asked."""
    directory = tmp_path_factory.mktemp("gateway-sampling")
    server, servicer = serve_fake_actor("script", sampled_ids(TOK, ANSWER))
    gateway = start_gateway(directory, [server.address], directory / "pool")
    gateway.pool_path = directory / "pool"
    try:
        yield gateway, servicer
    finally:
        gateway.stop()
        server.stop(0)


def recorded(gateway, session_id: str) -> list[common_pb2.SamplingParams]:
    with PoolReader(gateway.pool_path) as reader:
        return [call.sampling for call in reader.get_session(session_id).calls]


def schema_grammar(schema: dict = SCHEMA) -> common_pb2.Grammar:
    return common_pb2.Grammar(json_schema=json.dumps(schema))


def test_chat_completions_send_the_edits_and_the_schema_to_the_actor_and_record_them(scripted):
    gateway, servicer = scripted
    client = openai.OpenAI(base_url=f"{gateway.http}/s/chat-edits/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, logit_bias={"5": 10, "7": -100.0}, frequency_penalty=0.5,
        presence_penalty=-0.25, response_format={"type": "json_schema", "json_schema": {
            "name": "place", "schema": SCHEMA, "strict": True}}, extra_body={"repetition_penalty": 1.5})
    assert reply.choices[0].message.content == ANSWER
    sent = servicer.samplings[-1]
    assert dict(sent.logit_bias) == {5: 10.0, 7: -100.0}
    assert (sent.frequency_penalty, sent.presence_penalty, sent.repetition_penalty) == (0.5, -0.25, 1.5)
    assert sent.grammar == schema_grammar()

    client.chat.completions.create(model="m", messages=MESSAGES, response_format={"type": "json_object"},
                                   tools=TOOLS, tool_choice="none", extra_body={"repetition_penalty": 1})
    plain = servicer.samplings[-1]
    assert plain.grammar == common_pb2.Grammar(json_object=True)
    assert not plain.logit_bias and (plain.frequency_penalty, plain.repetition_penalty) == (0, 0)
    client.chat.completions.create(model="m", messages=MESSAGES, response_format={"type": "text"})
    assert not servicer.samplings[-1].HasField("grammar")
    assert recorded(gateway, "chat-edits") == [sent, plain, servicer.samplings[-1]]


def test_the_responses_api_sends_its_text_format_to_the_actor(scripted):
    gateway, servicer = scripted
    client = openai.OpenAI(base_url=f"{gateway.http}/s/responses-format/v1", api_key="x", max_retries=0)
    reply = client.responses.create(model="m", input="Where is it?", text={"format": {
        "type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}})
    assert reply.output_text == ANSWER and reply.text.format.type == "json_schema"
    assert servicer.samplings[-1].grammar == schema_grammar()
    client.responses.create(model="m", input="Where is it?", text={"format": {"type": "json_object"}})
    assert servicer.samplings[-1].grammar == common_pb2.Grammar(json_object=True)
    client.responses.create(model="m", input="Where is it?", text={"format": {"type": "text"}})
    assert not servicer.samplings[-1].HasField("grammar")
    assert [s.grammar for s in recorded(gateway, "responses-format")] == [
        schema_grammar(), common_pb2.Grammar(json_object=True), common_pb2.Grammar()]


def test_anthropic_messages_send_their_output_format_to_the_actor(scripted):
    gateway, servicer = scripted
    client = anthropic.Anthropic(base_url=f"{gateway.http}/s/messages-format", api_key="x", max_retries=0)
    reply = client.messages.create(model="m", max_tokens=16, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "none"},
                                   output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    assert reply.content[0].text == ANSWER
    assert servicer.samplings[-1].grammar == schema_grammar()
    assert recorded(gateway, "messages-format")[0].grammar == schema_grammar()


def test_grpc_chat_and_generate_send_the_proto_fields_as_given(scripted):
    gateway, servicer = scripted
    sampling = common_pb2.SamplingParams(max_tokens=8, logit_bias={3: 2.5}, frequency_penalty=-2,
                                         presence_penalty=2, repetition_penalty=0.5, grammar=schema_grammar())
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        chunks = list(stub.Chat(gateway_pb2.ChatRequest(
            session_id=session_id, messages=[gateway_pb2.ChatMessage(role="user", content="Where is it?")],
            sampling=sampling), timeout=30))
        assert chunks[-1].content == ANSWER
        chat = servicer.samplings[-1]
        generate_sampling = common_pb2.SamplingParams(max_tokens=8, grammar=common_pb2.Grammar(json_object=True))
        list(stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=[5, 6],
                                                              sampling=generate_sampling), timeout=30))
        generate = servicer.samplings[-1]
    for sent, asked in ((chat, sampling), (generate, generate_sampling)):
        for name in ("logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty", "grammar"):
            assert getattr(sent, name) == getattr(asked, name), name
    assert recorded(gateway, session_id) == [chat, generate]


SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
CHAT_REFUSALS = [
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {str(TOK.vocab_size): 1}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"logit_bias": {"5": "high"}}, "logit_bias"),
    ({"logit_bias": [5]}, "logit_bias"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"frequency_penalty": "low"}, "frequency_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"repetition_penalty": 1e-50}, "repetition_penalty"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "place"}}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": SCHEMA}}}, "response_format"),
    ({"response_format": {"type": "regex"}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ({"response_format": SCHEMA_FORMAT, "min_tokens": 40, "max_tokens": 60}, "min_tokens"),
    ({"response_format": SCHEMA_FORMAT, "tools": TOOLS, "tool_choice": "required"}, "response_format"),
    ({"response_format": {"type": "json_object"}, "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "lookup"}}}, "response_format"),
]


@pytest.mark.parametrize("change, param", CHAT_REFUSALS)
def test_chat_completions_refuse_bad_values_by_name_before_the_actor_hears_of_them(scripted, change, param):
    gateway, servicer = scripted
    before = servicer.calls
    body = {"model": "m", "messages": MESSAGES, **change}
    response = httpx.post(f"{gateway.http}/s/chat-refused/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"], error
    assert servicer.calls == before


def test_a_response_format_with_tools_is_a_document_or_a_call(scripted):
    """A forced call cannot also be the reply's document (refused, saying why); with tool_choice auto the grammar
    the actor gets is the document or one call as the template writes it."""
    gateway, servicer = scripted
    url = f"{gateway.http}/s/chat-refused/v1/chat/completions"
    forced = httpx.post(url, json={"messages": MESSAGES, "response_format": SCHEMA_FORMAT, "tools": TOOLS,
                                   "tool_choice": "required"}, timeout=30).json()["error"]["message"]
    assert "forced tool call" in forced and "arguments" in forced
    chosen = httpx.post(url, json={"messages": MESSAGES, "response_format": SCHEMA_FORMAT, "tools": TOOLS},
                        timeout=30)
    assert chosen.status_code == 200, chosen.text
    lark = servicer.samplings[-1].grammar.lark
    assert lark.startswith("start: %json ") and json.dumps(SCHEMA)[1:-1] in lark
    assert '{\\"name\\": \\"' + TOOLS[0]["function"]["name"] in lark


@pytest.mark.parametrize("change, param", [
    ({"text": {"format": {"type": "json_schema", "name": "place"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "place", "schema": {"type": "nonsense"}}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": "yes"}}},
     "text.format"),
    ({"text": {"format": {"type": "regex"}}}, "text.format"),
    ({"text": {"format": "json_object"}}, "text.format"),
    ({"text": {"format": {"type": "json_object"}}, "tools": RESPONSES_TOOLS, "tool_choice": "required"},
     "text.format"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
])
def test_the_responses_api_refuses_bad_formats_by_name(scripted, change, param):
    gateway, servicer = scripted
    before = servicer.calls
    body = {"model": "m", "input": "Where is it?", **change}
    response = httpx.post(f"{gateway.http}/s/responses-refused/v1/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and servicer.calls == before


@pytest.mark.parametrize("change", [
    {"output_config": {"format": {"type": "json_schema"}}},
    {"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
    {"output_config": {"format": {"type": "json_object"}}},
    {"output_config": {"format": "json"}},
    {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}, "tools": ANTHROPIC_TOOLS,
     "tool_choice": {"type": "any"}},
])
def test_anthropic_messages_refuse_bad_formats_by_name(scripted, change):
    gateway, servicer = scripted
    before = servicer.calls
    body = {"model": "m", "max_tokens": 4, "messages": MESSAGES, **change}
    response = httpx.post(f"{gateway.http}/s/messages-refused/v1/messages", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "output_config.format" in response.json()["error"]["message"] and servicer.calls == before


@pytest.mark.parametrize("change, says", [
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {TOK.vocab_size: 1.0}}, "logit_bias"),
    ({"logit_bias": {5: 100.5}}, "logit_bias"),
    ({"logit_bias": {5: float("nan")}}, "logit_bias"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": float("-inf")}, "presence_penalty"),
    ({"repetition_penalty": -1}, "repetition_penalty"),
    ({"repetition_penalty": 3}, "repetition_penalty"),
    ({"repetition_penalty": 1e-39}, "repetition_penalty"),           # logits / 1e-39 overflow float32
    ({"grammar": common_pb2.Grammar()}, "grammar"),
    ({"grammar": common_pb2.Grammar(json_object=False)}, "grammar"),
    ({"grammar": common_pb2.Grammar(json_schema="{")}, "grammar"),
    ({"grammar": common_pb2.Grammar(json_schema='{"type": "nonsense"}')}, "grammar"),
    ({"grammar": common_pb2.Grammar(json_object=True), "ignore_eos": True}, "ignore_eos"),
    ({"grammar": common_pb2.Grammar(json_object=True), "min_tokens": 2}, "min_tokens"),
])
def test_grpc_refuses_bad_values_with_the_same_checks(scripted, change, says):
    gateway, servicer = scripted
    before = servicer.calls
    sampling = common_pb2.SamplingParams(max_tokens=4, **change)
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        requests = [(stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, sampling=sampling, messages=[
                        gateway_pb2.ChatMessage(role="user", content="hi")])),
                    (stub.Generate, gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=[5],
                                                                       sampling=sampling))]
        for method, request in requests:
            with pytest.raises(grpc.RpcError) as err:
                list(method(request, timeout=30))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.value.details()
    assert servicer.calls == before


def test_grpc_refuses_a_grammar_with_a_forced_tool_call(scripted):
    gateway, servicer = scripted
    before = servicer.calls
    sampling = common_pb2.SamplingParams(max_tokens=4, grammar=schema_grammar())
    tools = [gateway_pb2.Tool(name="lookup", parameters_json='{"type": "object"}')]
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        for choice, says in (("required", "forced tool call"), ("lookup", "forced tool call")):
            request = gateway_pb2.ChatRequest(session_id=session_id, sampling=sampling, tools=tools,
                                              tool_choice=choice,
                                              messages=[gateway_pb2.ChatMessage(role="user", content="hi")])
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Chat(request, timeout=30))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.value.details()
        for choice in ("none", ""):
            list(stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, sampling=sampling, tools=tools,
                                                   tool_choice=choice,
                                                   messages=[gateway_pb2.ChatMessage(role="user", content="hi")]),
                           timeout=30))
    assert servicer.calls == before + 2
    assert servicer.samplings[-2].grammar.json_schema and servicer.samplings[-1].grammar.lark, \
        "tool_choice none keeps the schema; auto makes it the document or a call"


def test_a_random_actor_follows_the_schema_and_the_learner_recomputes_the_call(stack):
    """The mapped fields mean to the actor what they say: its answer follows the schema, and the learner, rebuilding
    the grammar, bias and penalties from the record, recomputes the log-probabilities it recorded."""
    client = openai.OpenAI(base_url=f"{stack.gateway.http}/s/constrained/v1", api_key="x", max_retries=0)
    for seed in (1, 2):
        reply = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=64, seed=seed, temperature=1.0, logit_bias={"5": 3},
            frequency_penalty=0.5, presence_penalty=0.25, extra_body={"repetition_penalty": 1.3},
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}})
        assert reply.choices[0].finish_reason == "stop"
        assert json.loads(reply.choices[0].message.content)["city"] in ("Oslo", "Rome")
    calls = list(stack.reader.get_session("constrained").calls)
    assert [call.sampling.grammar for call in calls] == [schema_grammar()] * 2
    learner, recorded_logprobs = learner_and_recorded(stack.directory / "random-tiny", calls)
    torch.testing.assert_close(learner, recorded_logprobs, atol=1e-5, rtol=0)
