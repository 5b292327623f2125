"""OpenAI's Responses API through a real gateway, driven by the ``openai`` client as the OpenAI Agents SDK drives it:
instructions, input items, function tools, ``previous_response_id``, streaming or not; every call recorded
token-in-token-out as the learner recomputes it, and the history an agent sends back (its items, or the id of the
previous response) spliced token for token."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from forge.assets import TINY_DIR
from forge.pool import PoolReader
from forge.tokenizer import Tokenizer

from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway
from helpers.recompute import learner_and_recorded

TOK = Tokenizer.from_dir(TINY_DIR)
INSTRUCTIONS = "You look things up."
TOOLS = [{"type": "function", "name": "lookup", "description": "look a key up", "strict": True,
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
                         "additionalProperties": False}}]
CHAT_TOOLS = [{"type": "function", "function": {k: TOOLS[0][k]
                                                for k in ("name", "description", "parameters", "strict")}}]
QUESTION = [{"role": "user", "content": "Who owns Bo?"}]
# Reasoning, text and a tool call, sampled in pieces of three characters: three output items that merge back into
# one assistant message.
SCRIPTED = '<think>Bo is listed.</think>\nLooking.<tool_call>{"name": "lookup", "arguments": {"key": "Bo"}}</tool_call>'


def client_of(base: str, session_id: str | None = None) -> openai.OpenAI:
    url = f"{base}/s/{session_id}/v1" if session_id else f"{base}/v1"
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def rendered(messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    return TOK.encode(TOK.render_chat(messages, tools, add_generation_prompt=True))


def extends(earlier, later) -> bool:
    done = list(earlier.prompt_ids) + list(earlier.completion_ids)
    return list(later.prompt_ids[:len(done)]) == done


def test_a_text_answer_is_a_response_recorded_in_the_session(stack):
    client = client_of(stack.gateway.http, "resp-text")
    raw = client.responses.with_raw_response.create(model="gpt-4o-mini", instructions=INSTRUCTIONS,
                                                    input="Who owns Bo?", max_output_tokens=6, temperature=0.8)
    reply = raw.parse()
    assert raw.headers["X-Forge-Session-Id"] == "resp-text" and raw.headers["X-Forge-Call-Index"] == "0"
    assert (reply.object, reply.model, reply.instructions) == ("response", "forge-tiny", INSTRUCTIONS)
    assert reply.id.startswith("resp_") and reply.status in ("completed", "incomplete")
    assert (reply.status == "incomplete") == (reply.incomplete_details is not None)
    message = reply.output[-1]
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert reply.output_text == message.content[0].text
    assert reply.max_output_tokens == 6 and reply.temperature == 0.8 and reply.tools == []
    assert reply.model_extra["forge"]["session_id"] == "resp-text" and reply.model_extra["forge"]["call_index"] == 0
    (call,) = stack.reader.get_session("resp-text").calls
    assert list(call.prompt_ids) == rendered([{"role": "system", "content": INSTRUCTIONS}, *QUESTION])
    assert reply.usage.input_tokens == len(call.prompt_ids) and reply.usage.output_tokens == len(call.completion_ids)
    assert reply.usage.total_tokens == len(call.prompt_ids) + len(call.completion_ids)


def test_a_streamed_answer_comes_as_events_that_add_up_to_the_response(stack):
    client = client_of(stack.gateway.http, "resp-stream")
    events = list(client.responses.create(model="m", input=QUESTION, max_output_tokens=8, temperature=0.9,
                                          stream=True))
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert len({event.response.id for event in (events[0], events[1], events[-1])}) == 1
    final = events[-1].response
    message = final.output[-1]
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(texts) == message.content[0].text
    assert "response.output_text.done" in types and types.index("response.output_item.done") > types.index(
        "response.content_part.done")
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.id for item in done] == [item.id for item in final.output]
    (call,) = stack.reader.get_session("resp-stream").calls
    assert final.usage.output_tokens == len(call.completion_ids)
    assert final.model_extra["forge"] == {"session_id": "resp-stream", "call_index": 0, "tito": "fresh"}


def test_previous_response_id_continues_the_conversation_token_for_token(stack):
    """The first answer runs in a session; the next ones, on the global URL, name only the previous response: they
    run in that session and their prompts extend the recorded samples (one streamed). The learner recomputes them
    all."""
    first = client_of(stack.gateway.http, "resp-chain").responses.create(
        model="m", instructions=INSTRUCTIONS, input="Who owns Bo?", max_output_tokens=6, temperature=0.9)
    client = client_of(stack.gateway.http)
    second = client.responses.create(model="forge-tiny", instructions=INSTRUCTIONS, input="And Al?",
                                     previous_response_id=first.id, max_output_tokens=4, temperature=0.9)
    assert second.previous_response_id == first.id
    assert second.model_extra["forge"] == {"session_id": "resp-chain", "call_index": 1, "tito": "splice"}
    events = list(client.responses.create(model="forge-tiny", instructions=INSTRUCTIONS, previous_response_id=second.id,
                                          input=[{"role": "user", "content": "Thanks."}], max_output_tokens=4,
                                          stream=True))
    assert events[-1].response.model_extra["forge"] == {"session_id": "resp-chain", "call_index": 2,
                                                        "tito": "splice"}
    calls = list(stack.reader.get_session("resp-chain").calls)
    assert len(calls) == 3 and extends(calls[0], calls[1]) and extends(calls[1], calls[2])
    learner, recorded = learner_and_recorded(stack.directory / "random-tiny", calls)
    torch.testing.assert_close(learner, recorded, atol=1e-5, rtol=0)

    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="forge-tiny", input="hi", previous_response_id="resp_unknown")
    assert caught.value.body["param"] == "previous_response_id"


def test_a_response_outside_any_session_is_continued_in_a_new_one(stack):
    """A call on the global URL without a session runs in a one-call session, closed once answered: the next
    response continues the conversation (its prompt holds the first question and answer) in one of its own."""
    client = client_of(stack.gateway.http)
    first = client.responses.create(model="forge-tiny", input="Who owns Bo?", max_output_tokens=3)
    second = client.responses.create(model="forge-tiny", input="And Al?", previous_response_id=first.id,
                                     max_output_tokens=3)
    session_id = second.model_extra["forge"]["session_id"]
    assert session_id != first.model_extra["forge"]["session_id"] and second.model_extra["forge"]["tito"] == "fresh"
    reasoning = "".join(part.text for item in first.output if item.type == "reasoning" for part in item.content)
    answered = {"role": "assistant", "content": first.output_text, "reasoning_content": reasoning or None}
    (later,) = stack.reader.get_session(session_id).calls
    assert list(later.prompt_ids) == rendered([*QUESTION, answered, {"role": "user", "content": "And Al?"}])


def test_function_calls_are_answered_as_items_and_splice_back(tmp_path):
    sampled = sampled_ids(TOK, SCRIPTED)
    server, servicer = serve_fake_actor("script", sampled)
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        client = client_of(gateway.http, "resp-tools")
        reply = client.responses.create(model="m", instructions=INSTRUCTIONS, input=QUESTION, tools=TOOLS)
        assert reply.status == "completed" and [item.type for item in reply.output] == [
            "reasoning", "message", "function_call"]
        reasoning, message, function_call = reply.output
        assert (reasoning.content[0].text, message.content[0].text) == ("Bo is listed.", "Looking.")
        assert (function_call.name, function_call.arguments) == ("lookup", '{"key": "Bo"}')
        assert function_call.call_id.startswith("call_") and function_call.id.startswith("fc_")
        assert servicer.prompts[0] == rendered([{"role": "system", "content": INSTRUCTIONS}, *QUESTION], CHAT_TOOLS)

        with client.responses.stream(model="m", instructions=INSTRUCTIONS, input=QUESTION, tools=TOOLS) as stream:
            types = [event.type for event in stream]
            final = stream.get_final_response()
        assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
        assert final.output[2].arguments == '{"key": "Bo"}' and final.output_text == "Looking."
        assert "response.reasoning_text.delta" in types and "response.function_call_arguments.done" in types

        result = {"type": "function_call_output", "call_id": function_call.call_id, "output": "Mai"}
        history = [*QUESTION, *[item.model_dump(exclude_none=True) for item in reply.output], result]
        again = client.responses.create(model="m", instructions=INSTRUCTIONS, input=history, tools=TOOLS)
        assert again.model_extra["forge"]["tito"] == "splice"
        chained = client.responses.create(model="m", instructions=INSTRUCTIONS, input=[result], tools=TOOLS,
                                          previous_response_id=reply.id)
        assert chained.model_extra["forge"]["tito"] == "splice"
        with PoolReader(tmp_path / "pool") as reader:
            first, _, third, fourth = reader.get_session("resp-tools").calls
        assert list(first.completion_ids) == sampled and extends(first, third)
        assert list(fourth.prompt_ids) == list(third.prompt_ids)
    finally:
        gateway.stop()
        server.stop(0)


def test_what_changes_nothing_is_accepted_as_the_agents_sdk_sends_it(stack):
    client = client_of(stack.gateway.http, "resp-ignored")
    reply = client.responses.create(
        model="gpt-4o-mini", instructions=INSTRUCTIONS, input=[{"content": "hi", "role": "user"}], include=[],
        tools=[], store=False, metadata={"run": "1"}, user="u-1", service_tier="auto", prompt_cache_key="k",
        safety_identifier="s", truncation="disabled", background=False, reasoning={"effort": "low", "summary": "auto"},
        text={"format": {"type": "text"}, "verbosity": "low"}, top_logprobs=0, max_tool_calls=3,
        prompt_cache_retention="24h", max_output_tokens=2, extra_body={"top_k": 5, "seed": 3})
    assert reply.metadata == {"run": "1"} and reply.reasoning.effort == "low" and reply.usage.output_tokens >= 1


@pytest.mark.parametrize("change, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [*QUESTION, {"type": "function_call_output", "output": "Mai"}]}, "input[1].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0]"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"truncation": "auto"}, "truncation"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_bad_fields_are_refused_by_name(stack, change, param):
    body = {"model": "m", "input": QUESTION, "max_output_tokens": 2, **change}
    response = httpx.post(f"{stack.gateway.http}/s/resp-bad/v1/responses", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_a_stream_whose_actor_fails_ends_with_response_failed(tmp_path):
    server, _servicer = serve_fake_actor("error-after-first-token")
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        events = list(client_of(gateway.http, "resp-failed").responses.create(model="m", input=QUESTION, stream=True))
        assert [event.type for event in events[:2]] == ["response.created", "response.in_progress"]
        failed = events[-1]
        assert failed.type == "response.failed" and failed.response.status == "failed"
        assert failed.response.id == events[0].response.id and failed.response.error.message
    finally:
        gateway.stop()
        server.stop(0)
