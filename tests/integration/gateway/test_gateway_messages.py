"""Anthropic's Messages API through a real gateway, driven by the ``anthropic`` client as an agent of the Claude
Code family drives it: text, thinking and tool use, streaming or not, token counts, errors in Anthropic's shape;
every call recorded token-in-token-out as the learner recomputes it."""

from __future__ import annotations

import anthropic
import httpx
import pytest
import torch

from forge.assets import TINY_DIR
from forge.pool import PoolReader
from forge.tokenizer import Tokenizer

from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway
from helpers.recompute import learner_and_recorded

TOK = Tokenizer.from_dir(TINY_DIR)
SYSTEM = [{"type": "text", "text": "You look things up.", "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "lookup", "description": "look a key up", "cache_control": {"type": "ephemeral"},
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}}}]
# Arguments written without spaces: JSON of the parsed input would differ from what the model wrote.
SCRIPTED = ('<think>Bo is listed.</think>\nLooking.'
            '<tool_call>{"name": "lookup", "arguments": {"key":"Bo"}}</tool_call>')


def client_of(base: str, session_id: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{base}/s/{session_id}", api_key="unused", max_retries=0)


def test_text_answers_streamed_or_not_are_recorded_as_the_learner_recomputes_them(stack):
    client = client_of(stack.gateway.http, "claude-text")
    messages = [{"role": "user", "content": [{"type": "text", "text": "Who owns Bo?"}]}]
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=6, system=SYSTEM, messages=messages,
                                   extra_body={"temperature": 0.8})
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "forge-tiny"
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.content[0].type == "text"
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=6, system=SYSTEM, messages=messages,
                                extra_body={"temperature": 0.8}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == streamed and final.usage.output_tokens >= 1
    calls = list(stack.reader.get_session("claude-text").calls)
    assert len(calls) == 2 and reply.usage.output_tokens == len(calls[0].completion_ids)
    assert reply.usage.input_tokens == len(calls[0].prompt_ids) == final.usage.input_tokens
    rendered = TOK.render_chat([{"role": "system", "content": "You look things up."},
                                {"role": "user", "content": "Who owns Bo?"}], add_generation_prompt=True)
    assert list(calls[0].prompt_ids) == TOK.encode(rendered)
    learner, recorded = learner_and_recorded(stack.directory / "random-tiny", calls)
    torch.testing.assert_close(learner, recorded, atol=1e-5, rtol=0)
    counted = client.messages.count_tokens(model="claude-sonnet-4-5", system=SYSTEM, messages=messages)
    assert counted.input_tokens == len(calls[0].prompt_ids)


def test_tool_use_is_answered_and_its_result_splices_back(tmp_path):
    sampled = sampled_ids(TOK, SCRIPTED)
    server, _servicer = serve_fake_actor("script", sampled)
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        client = client_of(gateway.http, "claude-tools")
        messages = [{"role": "user", "content": "Who owns Bo?"}]
        reply = client.messages.create(model="m", max_tokens=64, system=SYSTEM, tools=TOOLS, messages=messages,
                                       thinking={"type": "enabled", "budget_tokens": 1024})
        assert reply.stop_reason == "tool_use"
        assert [block.type for block in reply.content] == ["thinking", "text", "tool_use"]
        assert (reply.content[0].thinking, reply.content[1].text) == ("Bo is listed.", "Looking.")
        use = reply.content[2]
        assert (use.name, use.input) == ("lookup", {"key": "Bo"})

        with client.messages.stream(model="m", max_tokens=64, system=SYSTEM, tools=TOOLS, messages=messages) as s:
            final = s.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
        assert final.content[2].input == {"key": "Bo"} and final.stop_reason == "tool_use"

        history = [*messages, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Mai"},
                                                {"type": "text", "text": "And then?"}]}]
        again = client.messages.create(model="m", max_tokens=64, system=SYSTEM, tools=TOOLS, messages=history)
        assert again.model_extra["forge"]["tito"] == "splice"
        with PoolReader(tmp_path / "pool") as reader:
            first, _, third = reader.get_session("claude-tools").calls
        done = list(first.prompt_ids) + list(first.completion_ids)
        assert list(third.prompt_ids[:len(done)]) == done and list(first.completion_ids) == sampled
    finally:
        gateway.stop()
        server.stop(0)


@pytest.mark.parametrize("change, param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {}}}, "tools": TOOLS,
      "tool_choice": {"type": "any"}}, "output_config.format"),
    ({"mcp_servers": [{"url": "http://x"}]}, "mcp_servers"),
])
def test_bad_requests_get_anthropic_errors(stack, change, param):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **change}
    response = httpx.post(f"{stack.gateway.http}/s/claude-bad/v1/messages", json=body, timeout=60,
                          headers={"x-api-key": "unused", "anthropic-version": "2023-06-01"})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"]       # Anthropic's errors have no param field: the message names it


def test_ignored_fields_are_accepted_and_a_bad_body_answers_in_anthropics_shape(stack):
    client = client_of(stack.gateway.http, "claude-ignored")
    reply = client.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                                   metadata={"user_id": "u-1"}, service_tier="auto", speed="standard",
                                   cache_control={"type": "ephemeral"}, inference_geo="us",
                                   thinking={"type": "adaptive"}, output_config={"effort": "low"},
                                   stop_sequences=["\n\n"], extra_body={"top_k": 5})
    assert reply.usage.output_tokens >= 1
    response = httpx.post(f"{stack.gateway.http}/s/claude-ignored/v1/messages", json={"model": "m"}, timeout=60)
    assert response.status_code == 400 and response.json()["type"] == "error"
