"""The Responses API's pure parts: a request's items into the chat call (an assistant turn's items merged into one
message), the fields refused by name, ``previous_response_id`` spliced from what the gateway keeps, and the stream
of events as the ``openai`` client's own accumulator reads it into the same response as the non-streamed one."""

from __future__ import annotations

import json
import pickle

import pytest
from openai import omit
from openai._models import construct_type_unchecked
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from forge.gateway.calls import ChatDelta, ChatResult
from forge.gateway.errors import BadRequest, NotFound
from forge.gateway.http.conversations import Conversations
from forge.gateway.http.responses import Responses
from forge.gateway.http.responses_request import parse_responses_request
from forge.gateway.http.wire import Answering
from forge.parsing.completion import ParsedCompletion, ToolCall
from forge.v1 import common_pb2

WIRE = Responses()
TOOLS = [{"type": "function", "name": "lookup", "description": "look a key up", "strict": True,
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}]
CALL = ToolCall("call_1", "lookup", '{"key":"Bo"}')


def parse(**body):
    return parse_responses_request({"model": "m", **body}, 1024, 2048)


def test_items_of_one_assistant_turn_merge_into_the_message_the_model_wrote():
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Who "},
                                                             {"type": "input_text", "text": "owns Bo?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}],
              "encrypted_content": None},
             {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Looking.", "annotations": [], "logprobs": []}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup",
              "arguments": '{"key":"Bo"}', "status": "completed"},
             {"type": "function_call", "call_id": "call_2", "name": "lookup", "arguments": '{"key":"Al"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "Mai"},
             {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Li"}]},
             {"type": "function_call", "call_id": "call_3", "name": "lookup", "arguments": "{}"},
             {"type": "message", "role": "assistant", "content": "Done."}]
    call, options = parse(instructions="You look things up.", input=items, tools=TOOLS)
    assert call.messages == [
        {"role": "system", "content": "You look things up."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who owns Bo?"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "Hm.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key":"Bo"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": '{"key":"Al"}'}}]},
        {"role": "tool", "content": "Mai", "tool_call_id": "call_1"},
        {"role": "tool", "content": "Li", "tool_call_id": "call_2"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "assistant", "content": "Done."}]
    assert call.tools == [{"type": "function", "function": {k: TOOLS[0][k] for k in ("name", "description",
                                                                                      "parameters", "strict")}}]
    assert call.parse_tools and not call.force_tool_call and options.has_instructions
    assert options.response_id.startswith("resp_") and pickle.loads(pickle.dumps(options)) == options


def test_settings_reach_the_call():
    call, options = parse(input="hi", max_output_tokens=7, temperature=0.5, top_p=0.9, reasoning={"effort": "low"},
                          tools=TOOLS, tool_choice={"type": "function", "name": "lookup"}, parallel_tool_calls=False,
                          stream=True, extra=None, store=False, metadata={"run": "1"}, truncation="disabled",
                          include=["reasoning.encrypted_content"], top_logprobs=0, background=False, seed=3,
                          text={"format": {"type": "text"}, "verbosity": "low"}, top_k=5,
                          stream_options={"include_obfuscation": False})
    assert call.messages == [{"role": "user", "content": "hi"}]
    assert (call.sampling.max_tokens, call.sampling.top_k, call.sampling.seed) == (7, 5, 3)
    assert call.sampling.temperature == pytest.approx(0.5) and call.sampling.top_p == pytest.approx(0.9)
    assert call.template_kwargs == {"reasoning_effort": "low"}
    assert call.force_tool_call and call.forced_function == "lookup" and not call.parallel_tool_calls
    assert options.stream and not options.has_instructions
    assert options.echo["metadata"] == {"run": "1"} and options.echo["tools"][0]["strict"] is True
    assert parse(input="hi", tools=TOOLS, tool_choice="none")[0].parse_tools is False
    assert parse(input="hi", tool_choice="auto", tools=[])[0].tools is None


def test_text_format_becomes_the_calls_grammar():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    call = parse(input="hi", text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                                              "strict": True}})[0]
    assert call.sampling.grammar == common_pb2.Grammar(json_schema=json.dumps(schema))
    call = parse(input="hi", text={"format": {"type": "json_object"}}, tools=TOOLS, tool_choice="none")[0]
    assert call.sampling.grammar == common_pb2.Grammar(json_object=True)
    assert not parse(input="hi", text={"format": {"type": "text"}})[0].sampling.HasField("grammar")


@pytest.mark.parametrize("change, param", [
    ({"input": None}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": ["hi"]}, "input[0]"),
    ({"input": [{"type": "function_call", "name": "lookup", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "lookup", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "Mai"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": [{"type": "reasoning", "summary": [], "content": [{"type": "text", "text": "x"}]}]},
     "input[0].content[0]"),
    ({"instructions": ["x"]}, "instructions"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [TOOLS[0], {"type": "function", "name": ""}]}, "tools[1].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "{}"}]}, "tools[0].parameters"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": "always"}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": "{}"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"maxItems": 100000}}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": 3, "schema": {}}}}, "text.format"),
    ({"text": {"format": {"type": "json_object"}}, "tool_choice": "required"}, "text.format"),
    ({"text": {"format": {"type": "grammar"}}, "tools": None}, "text.format"),
    ({"text": {"format": "text"}}, "text.format"),
    ({"reasoning": {"effort": 3}}, "reasoning.effort"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 2048}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"previous_response_id": 5}, "previous_response_id"),
])
def test_bad_fields_are_refused_by_name(change, param):
    with pytest.raises(BadRequest) as caught:
        parse(**{"input": "hi", "tools": TOOLS, **change})
    assert caught.value.param == param, caught.value.message


def result_of(parsed: ParsedCompletion, finish: int = common_pb2.FINISH_REASON_STOP) -> ChatResult:
    return ChatResult(parsed=parsed, finish_reason=finish, session_id="s", call_index=0, prompt_ids=[1, 2, 3],
                      completion_ids=[4, 5], tito="fresh")


def test_previous_response_id_continues_the_stored_conversation_in_its_session():
    conversations = Conversations()
    call, options = parse(instructions="Be brief.", input="Who owns Bo?", tools=TOOLS)
    assert WIRE.complete(call, options, conversations, "s") == (call, "s")
    WIRE.remember(call, options, result_of(ParsedCompletion("", "Hm.", [CALL])), conversations)
    follow, follow_options = parse(instructions="Be terse.", previous_response_id=options.response_id, tools=TOOLS,
                                   input=[{"type": "function_call_output", "call_id": "call_1", "output": "Mai"}])
    completed, session = WIRE.complete(follow, follow_options, conversations, None)
    assert session == "s" and WIRE.complete(follow, follow_options, conversations, "mine")[1] == "mine"
    assert completed.messages == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "Who owns Bo?"},
        {"role": "assistant", "content": None, "reasoning_content": "Hm.", "tool_calls": [CALL.to_openai()]},
        {"role": "tool", "content": "Mai", "tool_call_id": "call_1"}]
    # an answer in a one-call session (no session named) leaves none to continue in
    alone, alone_options = parse(input="hi")
    WIRE.complete(alone, alone_options, conversations, None)
    WIRE.remember(alone, alone_options, result_of(ParsedCompletion("Hello.")), conversations)
    after, after_options = parse(input="Again.", previous_response_id=alone_options.response_id)
    completed, session = WIRE.complete(after, after_options, conversations, None)
    assert session is None and [m["content"] for m in completed.messages] == ["hi", "Hello.", "Again."]
    lost, lost_options = parse(input="hi", previous_response_id="resp_gone")
    with pytest.raises(NotFound) as caught:
        WIRE.complete(lost, lost_options, conversations, None)
    assert caught.value.param == "previous_response_id" and caught.value.status == 404


def streamed(options, deltas: list[ChatDelta], result: ChatResult) -> tuple[list[dict], Response]:
    """The events of a streamed answer, and the final response the ``openai`` client's accumulator makes of them."""
    writer = WIRE.writer(Answering(None, "forge-tiny"), options)
    events = [*writer.first(), *[e for d in deltas for e in writer.deltas(d)], *writer.final(result)]
    state = ResponseStreamState(input_tools=TOOLS, text_format=omit)
    for event in events:
        assert event.name == event.data["type"]
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=event.data))
    return [event.data for event in events], state._completed_response


@pytest.mark.parametrize("stream_text", [True, False])
def test_a_stream_reads_as_the_answer(stream_text):
    _call, options = parse(input="Who owns Bo?", tools=TOOLS, stream=True)
    parsed = ParsedCompletion("Looking.", "Bo is listed.", [CALL, ToolCall("call_2", "lookup", "{}")])
    deltas = [ChatDelta(reasoning="Bo is "), ChatDelta(reasoning="listed."), ChatDelta(content="Look")]
    result = result_of(parsed)
    result.content = "ing."
    if not stream_text:
        deltas, result.reasoning, result.content = [], parsed.reasoning, parsed.content
    events, final = streamed(options, deltas, result)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "reasoning", "message", "function_call", "function_call"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Looking."
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Bo is listed."
    answer = events[-1]["response"]
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final.output_text == "Looking." and final.id == options.response_id
    assert [(o.call_id, o.arguments) for o in final.output[2:]] == [("call_1", '{"key":"Bo"}'), ("call_2", "{}")]
    plain = WIRE.answer(result, Answering(None, "forge-tiny"), options)
    assert Response.model_validate(plain).output_text == "Looking."
    strip = [{k: v for k, v in item.items() if k != "id"} for item in plain["output"]]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in answer["output"]]


def test_an_answer_cut_by_max_output_tokens_is_incomplete():
    _call, options = parse(input="hi", max_output_tokens=2, stream=True)
    result = result_of(ParsedCompletion(""), common_pb2.FINISH_REASON_LENGTH)
    events, final = streamed(options, [], result)
    assert final is None and events[-1]["type"] == "response.incomplete"
    answer = events[-1]["response"]
    assert answer["status"] == "incomplete" and answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["output"][0]["content"][0]["text"] == "" and answer["output"][0]["status"] == "incomplete"
    assert answer["usage"]["output_tokens"] == 2 and answer["usage"]["total_tokens"] == 5
    failed = WIRE.writer(Answering(None, "m"), options).failed(BadRequest("no"))[0].data
    assert failed["type"] == "response.failed" and failed["response"]["error"]["message"] == "no"
