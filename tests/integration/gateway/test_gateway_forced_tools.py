"""Forced tool calls through a real gateway: ``tool_choice: "required"`` and a named function are served exactly
(the tool call's opener is prompt, the rest is sampled and recorded as the learner recomputes it), answered as
ordinary tool calls, streaming or not, and spliced back token for token."""

from __future__ import annotations

import openai
import torch

from forge.assets import TINY_DIR
from forge.pool import PoolReader
from forge.tokenizer import Tokenizer

from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway
from helpers.recompute import learner_and_recorded

TOK = Tokenizer.from_dir(TINY_DIR)
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a key up",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "lookup"}}
MESSAGES = [{"role": "user", "content": "Who owns Bo?"}]


def rendered(messages: list[dict]) -> str:
    return TOK.render_chat(messages, TOOLS, add_generation_prompt=True)


def test_a_named_function_is_called_with_the_arguments_the_model_writes(tmp_path):
    sampled = sampled_ids(TOK, '{"key": "Bo"}}</tool_call>')
    server, servicer = serve_fake_actor("script", sampled)
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        client = openai.OpenAI(base_url=f"{gateway.http}/s/named/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("lookup", '{"key": "Bo"}')
        opener = '<tool_call>{"name": "lookup", "arguments": '
        assert servicer.prompts[0] == TOK.encode(rendered(MESSAGES) + opener)

        stream = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
                                                stream=True)
        content, calls, finish = "", [], None
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            calls += delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
        assert (content, finish) == ("", "tool_calls")
        assert [(c.function.name, c.function.arguments) for c in calls] == [("lookup", '{"key": "Bo"}')]

        history = [*MESSAGES, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "Mai"}]
        again = client.chat.completions.create(model="m", messages=history, tools=TOOLS)
        assert again.model_extra["forge"]["tito"] == "splice"
        with PoolReader(tmp_path / "pool") as reader:
            first, _, third = reader.get_session("named").calls
        done = list(first.prompt_ids) + list(first.completion_ids)
        assert list(third.prompt_ids[:len(done)]) == done and list(first.completion_ids) == sampled
    finally:
        gateway.stop()
        server.stop(0)


def test_required_lets_the_model_pick_the_function(tmp_path):
    server, servicer = serve_fake_actor("script", sampled_ids(TOK, '"add", "arguments": {"a": 2}}</tool_call>'))
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        client = openai.OpenAI(base_url=f"{gateway.http}/s/required/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice="required")
        call = reply.choices[0].message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("add", '{"a": 2}')
        assert servicer.prompts[0] == TOK.encode(rendered(MESSAGES) + '<tool_call>{"name": ')
        for bad, says in (({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among"),
                          ({"tool_choice": "required", "tools": None}, "needs tools"),
                          ({"tool_choice": "always"}, "tool_choice must be")):
            try:
                client.chat.completions.create(model="m", messages=MESSAGES, **{"tools": TOOLS, **bad})
                raise AssertionError(f"{bad} was accepted")
            except openai.BadRequestError as exc:
                assert exc.body["param"] == "tool_choice" and says in exc.body["message"]
        assert len(servicer.prompts) == 1
    finally:
        gateway.stop()
        server.stop(0)


def test_forced_calls_are_recorded_as_the_learner_recomputes_them(stack):
    """A random-weight actor samples after the opener: the record is an ordinary call whose prompt ends with the
    opener, and the learner's log-probabilities of it equal the actor's."""
    client = openai.OpenAI(base_url=f"{stack.gateway.http}/s/exact/v1", api_key="x", max_retries=0)
    for choice in (NAMED, "required"):
        for stream in (False, True):
            answer = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                                    max_tokens=12, temperature=0.9, seed=5, stream=stream)
            if stream:
                for _chunk in answer:
                    pass
    calls = list(stack.reader.get_session("exact").calls)
    assert len(calls) == 4
    for call, opener in zip(calls, ['<tool_call>{"name": "lookup", "arguments": '] * 2 + ['<tool_call>{"name": '] * 2,
                            strict=True):
        assert list(call.prompt_ids) == TOK.encode(rendered(MESSAGES) + opener)
    learner, recorded = learner_and_recorded(stack.directory / "random-tiny", calls)
    torch.testing.assert_close(learner, recorded, atol=1e-5, rtol=0)
