"""Plain messages (a role and a text) read the short way are what the general path gives, on generated messages, over
HTTP (chat completions' JSON) and gRPC (``ChatMessage``): the same messages, or the same refusal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.gateway.http.openai_messages import parse_message, parse_messages
from forge.gateway.messages import chat_call_from_proto, chat_message, tool_call_dict
from forge.v1 import gateway_pb2

from helpers.refusals import refusal

roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot", ""]) | st.integers()
contents = st.none() | st.text(max_size=8) | st.integers() | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": st.text(max_size=4)}), max_size=2)
messages = st.dictionaries(st.sampled_from(["role", "content", "name", "tool_call_id", "reasoning_content"]),
                           roles | contents, max_size=5) | st.fixed_dictionaries({"role": roles, "content": contents})


@settings(max_examples=500, deadline=None)
@given(st.lists(messages | st.integers(), min_size=1, max_size=6))
def test_plain_messages_read_the_short_way_are_what_the_general_path_gives(raw):
    def general():
        return [parse_message(message, f"messages[{i}]") for i, message in enumerate(raw)]

    assert refusal(parse_messages, raw) == refusal(general)
    if refusal(general) is None:
        assert parse_messages(raw) == general()


proto_messages = st.builds(
    gateway_pb2.ChatMessage, role=st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot"]),
    content=st.text(max_size=8), name=st.sampled_from(["", "calc"]), tool_call_id=st.sampled_from(["", "c1"]),
    reasoning_content=st.sampled_from(["", "hmm"]),
    tool_calls=st.lists(st.builds(gateway_pb2.ToolCall, id=st.just("c1"), name=st.just("f"), arguments=st.just("{}")),
                        max_size=1))


@settings(max_examples=300, deadline=None)
@given(st.lists(proto_messages, min_size=1, max_size=5))
def test_plain_grpc_messages_read_the_short_way_are_what_the_general_path_gives(given_messages):
    def general():
        return [chat_message(f"messages[{i}]", m.role, m.content, [tool_call_dict(c) for c in m.tool_calls],
                             {"tool_call_id": m.tool_call_id, "name": m.name}, m.reasoning_content)
                for i, m in enumerate(given_messages)]

    def fast():
        return chat_call_from_proto(gateway_pb2.ChatRequest(messages=given_messages), 1024).messages

    expected = refusal(general)
    assert refusal(fast) == expected
    if expected is None:
        assert fast() == general()
