"""Structured output, logit_bias and penalties through a real gateway and actor, in the three HTTP APIs: the actor
samples under them, every call is recorded with its sampling parameters, finished structured outputs are documents
of their schema, and the learner, rebuilding the edits from the recorded calls, recomputes the actor's
log-probabilities (which it would not without them)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
import torch

from forge.assets import TINY_DIR
from forge.tokenizer import Tokenizer
from forge.v1 import pool_pb2

from helpers.recompute import learner_and_recorded

TOK = Tokenizer.from_dir(TINY_DIR)
SCHEMA = {"type": "object", "properties": {"owner": {"enum": ["Mai", "Bo", "Kit"]}, "sure": {"type": "boolean"}},
          "required": ["owner", "sure"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Who owns Bo? Answer in JSON."}]
PENALTIES = {"frequency_penalty": 1.2, "presence_penalty": 0.6, "logit_bias": {"17": 6.0, "42": -100},
             "extra_body": {"repetition_penalty": 1.4}}


def openai_client(stack, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway.http}/s/{session}/v1", api_key="x", max_retries=0)


def drain(answer, stream: bool) -> None:
    if stream:
        for _event in answer:
            pass


def recorded_calls(stack, session: str) -> list[pool_pb2.CallRecord]:
    return list(stack.reader.get_session(session).calls)


def assert_exact(stack, calls: list[pool_pb2.CallRecord]) -> None:
    learner, recorded = learner_and_recorded(stack.directory / "random-tiny", calls)
    torch.testing.assert_close(learner, recorded, atol=1e-5, rtol=0)
    bare = []
    for call in calls:
        plain = pool_pb2.CallRecord()
        plain.CopyFrom(call)
        for name in ("grammar", "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            plain.sampling.ClearField(name)
        bare.append(plain)
    unedited, _ = learner_and_recorded(stack.directory / "random-tiny", bare)
    assert not torch.allclose(unedited, recorded, atol=1e-3), "the edits changed what was sampled"


def assert_documents(stack, calls: list[pool_pb2.CallRecord]) -> None:
    """Every completion that ended (not cut by max_tokens) is a document of SCHEMA."""
    ended = [c for c in calls if c.finish_reason == 1]
    assert ended, "some structured outputs were completed"
    for call in ended:
        document = json.loads(TOK.decode(list(call.completion_ids[:-1])))
        assert document["owner"] in ("Mai", "Bo", "Kit") and isinstance(document["sure"], bool)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_response_formats_are_sampled_and_replayed_exactly(stack, stream):
    session = f"chat-format-{stream}"
    client = openai_client(stack, session)
    for seed in range(3):
        drain(client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=40, temperature=1.0, seed=seed, stream=stream,
            response_format={"type": "json_schema", "json_schema": {"name": "owner", "schema": SCHEMA,
                                                                    "strict": True}}), stream)
    drain(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0.8, seed=9,
                                         stream=stream, response_format={"type": "json_object"}), stream)
    calls = recorded_calls(stack, session)
    assert [c.sampling.grammar.WhichOneof("kind") for c in calls] == ["json_schema"] * 3 + ["json_object"]
    assert_documents(stack, calls[:3])
    assert_exact(stack, calls)


@pytest.mark.parametrize("stream", [False, True])
def test_penalties_and_logit_bias_are_sampled_and_replayed_exactly(stack, stream):
    session = f"penalties-{stream}"
    client = openai_client(stack, session)
    for seed in range(2):
        drain(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0.9,
                                             seed=seed, stream=stream, **PENALTIES), stream)
    calls = recorded_calls(stack, session)
    for call in calls:
        sampling = call.sampling
        assert dict(sampling.logit_bias) == {17: 6.0, 42: -100.0}
        assert (sampling.frequency_penalty, sampling.presence_penalty) == pytest.approx((1.2, 0.6))
        assert sampling.repetition_penalty == pytest.approx(1.4)
    assert_exact(stack, calls)


def test_responses_and_messages_structured_outputs_are_replayed_exactly(stack):
    responses = openai_client(stack, "responses-format")
    for seed in range(2):
        responses.responses.create(model="m", input="Who owns Bo? Answer in JSON.", max_output_tokens=40,
                                   temperature=1.0, extra_body={"seed": seed},
                                   text={"format": {"type": "json_schema", "name": "owner", "schema": SCHEMA}})
    messages = anthropic.Anthropic(base_url=f"{stack.gateway.http}/s/messages-format", api_key="x", max_retries=0)
    messages.messages.create(model="m", max_tokens=40, messages=MESSAGES,
                             extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    calls = recorded_calls(stack, "responses-format") + recorded_calls(stack, "messages-format")
    assert len(calls) == 3 and all(c.sampling.grammar.json_schema for c in calls)
    assert json.loads(calls[0].sampling.grammar.json_schema) == SCHEMA
    assert_exact(stack, calls)


STRICT_TOOLS = [
    {"type": "function", "function": {"name": "lookup", "strict": True, "parameters": {
        "type": "object", "properties": {"key": {"enum": ["Bo", "Mai"]}}, "required": ["key"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"enum": [1, 2, 3]}}, "required": ["a"], "additionalProperties": False}}}]


def assert_valid_call(call) -> None:
    arguments = json.loads(call.function.arguments)
    assert arguments in ([{"key": "Bo"}, {"key": "Mai"}] if call.function.name == "lookup" else
                         [{"a": 1}, {"a": 2}, {"a": 3}]), (call.function.name, arguments)


def test_strict_forced_calls_follow_their_schemas_and_are_replayed_exactly(stack):
    client = openai_client(stack, "strict-tools")
    answers = [client.chat.completions.create(model="m", messages=MESSAGES, tools=STRICT_TOOLS, tool_choice=choice,
                                              max_tokens=40, temperature=1.0, seed=seed)
               for choice in ({"type": "function", "function": {"name": "lookup"}}, "required") for seed in range(3)]
    finished = [a.choices[0] for a in answers if a.choices[0].finish_reason == "tool_calls"]
    assert finished, "some forced calls were completed"
    for choice in finished:
        assert_valid_call(choice.message.tool_calls[0])
    calls = recorded_calls(stack, "strict-tools")
    assert len(calls) == 6 and all(c.sampling.grammar.lark for c in calls)
    assert_exact(stack, calls)


def test_a_json_reply_may_still_call_a_tool(stack):
    """response_format with tools and tool_choice auto: each reply is a document of the schema or a valid call."""
    client = openai_client(stack, "reply-or-call")
    answers = [client.chat.completions.create(
        model="m", messages=MESSAGES, tools=STRICT_TOOLS, max_tokens=40, temperature=1.0, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "owner", "schema": SCHEMA}})
        for seed in range(6)]
    finished = [a.choices[0] for a in answers if a.choices[0].finish_reason in ("stop", "tool_calls")]
    assert finished, "some replies were completed"
    for choice in finished:
        if choice.finish_reason == "tool_calls":
            assert_valid_call(choice.message.tool_calls[0])
        else:
            document = json.loads(choice.message.content)
            assert document["owner"] in ("Mai", "Bo", "Kit")
    assert_exact(stack, recorded_calls(stack, "reply-or-call"))
