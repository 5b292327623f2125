"""The gateway's OpenAI-compatible HTTP front end against a real actor and gateway process: a black-box agent
written only with the ``openai`` client, token-in-token-out records, stop strings, bad input, many sessions."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import math
import uuid
from pathlib import Path
from urllib.parse import quote

import grpc
import httpx
import openai
import pytest
import torch

import forge
from forge.assets import TINY_DIR
from forge.gateway.calls import WHOLE_ANSWER
from forge.gateway.http.app import SESSION_HEADER
from forge.gateway.modelinfo import ModelInfo
from forge.pool import NotFoundError, PoolReader
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2, pool_pb2

from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway
from helpers.recompute import learner_and_recorded
from helpers.waiting import wait_for

TOK = Tokenizer.from_dir(TINY_DIR)
INFO = ModelInfo(TOK, 2048, "tiny", directory=TINY_DIR)
MAX_BODY = 64 * 1024
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a key up",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]


# Qwen3's switch: with enable_thinking false the generation prompt opens an empty reasoning block.
THINKING_SWITCH = "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}" \
                  "<think>\n\n</think>\n\n{% endif %}"


# The stack fixture (conftest.py): the gateway reads the chat template of the actor's checkpoint, given the switch.
GATEWAY_ARGS = ("--max-body-bytes", str(MAX_BODY), "--model", "{checkpoint}", "--served-model-name", "tiny-alias")


def prepare_checkpoint(checkpoint: Path) -> None:
    (checkpoint / "chat_template.jinja").write_text((TINY_DIR / "chat_template.jinja").read_text() + THINKING_SWITCH)


def session_calls(reader: PoolReader, session_id: str) -> list[pool_pb2.CallRecord]:
    return list(reader.get_session(session_id).calls)


def replay(actor_address: str, call: pool_pb2.CallRecord) -> list[int]:
    """The actor's own sample for a recorded call's prompt and sampling (same seed -> same tokens)."""
    with grpc.insecure_channel(actor_address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        ids = []
        for chunk in stub.Generate(actor_pb2.GenerateRequest(prompt_ids=call.prompt_ids, sampling=call.sampling),
                                   timeout=60):
            ids += chunk.token_ids
        return ids


def test_a_black_box_agent_with_the_openai_client_leaves_an_exact_session(stack):
    actor, gateway, reader = stack.actor, stack.gateway, stack.reader
    opened = httpx.post(f"{gateway.http}/v1/sessions", json={"task_id": "t-1", "domain": "agent"}).json()
    session_id = opened["session"]["session_id"]
    assert opened["session"]["status"] == "open" and opened["api_key"].startswith("fsk_")
    client = openai.OpenAI(base_url=gateway.base_url, api_key=opened["api_key"], max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == ["forge-tiny"]

    messages = [{"role": "system", "content": "You look things up."}, {"role": "user", "content": "Who owns Bo?"}]
    first = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS, max_tokens=8,
                                           seed=11, temperature=1.0, logprobs=True,
                                           extra_body={"return_token_ids": True})
    choice = first.choices[0]
    assert first.usage.completion_tokens == len(choice.token_ids) and choice.finish_reason in ("length", "stop")
    messages.append(choice.message.model_dump(exclude_none=True))
    # the agent calls a tool itself (a random-weight model will not) and sends the result back
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "Bo"}'}}]})
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "Bo is owned by Mai."})
    stream = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS, max_tokens=8,
                                            seed=12, stream=True, stream_options={"include_usage": True},
                                            logprobs=True, extra_body={"return_token_ids": True})
    text, streamed_ids, streamed_logprobs, usage, finish = "", [], [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            streamed_ids += c.model_extra.get("token_ids") or []
            streamed_logprobs += [t.logprob for t in (c.logprobs.content if c.logprobs else [])]
            finish = c.finish_reason or finish
    assert usage.completion_tokens == len(streamed_ids) and finish in ("length", "stop")
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    third = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS, max_tokens=4,
                                           seed=13)
    assert third.model_extra["forge"] == {"session_id": session_id, "call_index": 2, "tito": "splice"}
    ended = httpx.post(f"{gateway.http}/v1/sessions/{session_id}/end",
                       headers={"Authorization": f"Bearer {opened['api_key']}"},
                       json={"outcome_rewards": {"correct": 1.0}, "metrics": {"turns": 3}}).json()
    assert ended["session"]["status"] == "completed" and ended["session"]["num_calls"] == 3

    stored = reader.get_session(session_id)
    assert stored.session.task_id == "t-1" and stored.session.outcome_rewards["correct"] == 1.0
    calls = list(stored.calls)
    assert [c.index for c in calls] == [0, 1, 2] and all(c.session_id == session_id for c in calls)
    assert list(calls[0].completion_ids) == choice.token_ids
    assert list(calls[0].prompt_ids) == first.model_extra["prompt_token_ids"]
    assert calls[0].logprobs == pytest.approx([t.logprob for t in choice.logprobs.content], abs=1e-6)
    assert list(calls[1].completion_ids) == streamed_ids
    assert calls[1].logprobs == pytest.approx(streamed_logprobs, abs=1e-6)
    for earlier, later in itertools.pairwise(calls):     # each prompt extends the exact earlier sample
        done = list(earlier.prompt_ids) + list(earlier.completion_ids)
        assert list(later.prompt_ids[:len(done)]) == done
        assert later.timing.tool_s >= 0 and later.timing.total_s > 0
    rendered = TOK.render_chat(messages[:2], TOOLS, add_generation_prompt=True)
    assert list(calls[0].prompt_ids) == TOK.encode(rendered)
    for call in calls:
        assert call.sampling.temperature == 1.0 and call.sampling.HasField("seed") and call.actor
        assert len(call.logprobs) == len(call.weight_versions) == len(call.completion_ids)
        assert replay(actor.address, call) == list(call.completion_ids)


def test_tito_splices_sampled_ids_that_retokenising_would_change(stack):
    gateway, reader = stack.gateway, stack.reader
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    for seed in range(20):
        session_id = f"tito-{uuid.uuid4().hex}"
        session = openai.OpenAI(base_url=f"{gateway.http}/s/{session_id}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Compute 12 + 30."}]
        reply = session.chat.completions.create(model="forge-tiny", messages=messages, max_tokens=10, seed=seed)
        completion = list(session_calls(reader, session_id)[0].completion_ids)
        if TOK.encode(TOK.decode(completion)) != completion:
            break
    else:
        pytest.fail("no sample with a non-canonical token split in 20 seeds")
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
    second = session.chat.completions.create(model="forge-tiny", messages=messages, max_tokens=4, seed=1)
    assert second.model_extra["forge"]["tito"] == "splice"
    first_call, second_call = session_calls(reader, session_id)
    prompt, sampled = list(first_call.prompt_ids), list(first_call.completion_ids)
    assert list(second_call.prompt_ids[len(prompt):len(prompt) + len(sampled)]) == sampled
    rendered = TOK.render_chat(messages, add_generation_prompt=True)
    assert TOK.decode(second_call.prompt_ids) == rendered and list(second_call.prompt_ids) != TOK.encode(rendered)
    assert client.models.list().data[0].id == "forge-tiny"


def test_stop_strings_cut_the_text_and_keep_every_sampled_id(stack):
    gateway, reader = stack.gateway, stack.reader
    body = {"messages": [{"role": "user", "content": "Say something long."}], "max_tokens": 24, "seed": 5,
            "temperature": 1.0, "ignore_eos": True, "return_token_ids": True}
    full = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=60).json()
    text, ids = full["choices"][0]["message"]["content"], full["choices"][0]["token_ids"]
    stop = next(text[i:i + 2] for i in range(4, len(text) - 2) if text[i:i + 2].strip() and
                "\ufffd" not in text[i:i + 2])
    cut = text[:text.index(stop)]
    for stream in (False, True):
        response = httpx.post(f"{gateway.base_url}/chat/completions", json={**body, "stop": [stop, "never"],
                                                                             "stream": stream}, timeout=60)
        if stream:
            events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
            forge = chunks[-1]["forge"]
        else:
            answer = response.json()
            content, finish, forge = (answer["choices"][0]["message"]["content"],
                                      answer["choices"][0]["finish_reason"], answer["forge"])
        assert (content, finish) == (cut, "stop")
        recorded = session_calls(reader, forge["session_id"])[0]
        assert recorded.finish_reason == common_pb2.FINISH_REASON_STOP
        sampled = list(recorded.completion_ids)
        assert sampled == ids[:len(sampled)] and stop in TOK.decode(sampled)


def pool_counts(reader: PoolReader) -> tuple[float, float]:
    figures = reader.stats()
    return figures["calls"], figures["sessions"]


def test_bad_input_gets_an_openai_error_and_leaves_no_record(stack):
    gateway, reader = stack.gateway, stack.reader
    url = f"{gateway.base_url}/chat/completions"
    good = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ended = httpx.post(f"{gateway.http}/v1/sessions", json={}).json()["session"]["session_id"]
    httpx.post(f"{gateway.http}/v1/sessions/{ended}/end", json={})
    before = pool_counts(reader)
    cases = [
        (url, b"{not json", 400, "not valid JSON"),
        (url, b"", 400, "empty"),
        (url, b"[1, 2]", 400, "JSON object"),
        (url, json.dumps({**good, "messages": [{"role": "user", "content": 5}]}).encode(), 400, "content"),
        (url, json.dumps({**good, "max_tokens": "many"}).encode(), 400, "max_tokens must be an int"),
        (url, json.dumps({**good, "n": 0}).encode(), 400, "n must be in [1, 128]"),
        (url, json.dumps({**good, "messages": [{"role": "wizard", "content": "hi"}]}).encode(), 400, "role"),
        (url, json.dumps({**good, "messages": [{"role": "user", "content": "1 " * 2100}]}).encode(), 400,
         "context"),
        (url, json.dumps({**good, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}).encode(), 413,
         "exceeds"),
        (url, b"[" * 30000 + b"]" * 30000, 400, "nested too deeply"),
        (url, json.dumps({**good, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": json.loads('{"a": ' * 900 + "1" + "}" * 900)}}]}).encode(), 400, ""),
        (url, json.dumps({**good, "stop": ["x"] * 17}).encode(), 400, "at most 16 stop strings"),
        (f"{gateway.http}/s/{ended}/v1/chat/completions", json.dumps(good).encode(), 409, "completed"),
        (f"{gateway.http}/s/{'x' * 300}/v1/chat/completions", json.dumps(good).encode(), 400, "256 bytes"),
        (f"{gateway.http}/v1/sessions/nope/end", b"{}", 404, "unknown session"),
        (f"{gateway.http}/v1/sessions/nope/rewards", b'{"call_index": 0, "reward": 1}', 404, "nope"),
        (f"{gateway.http}/v1/sessions/nope/rewards", b'{"call_index": "a", "reward": 1}', 400, "call_index"),
        (f"{gateway.http}/v1/sessions", b'{"group_size": 3}', 400, "group_id"),
        (f"{gateway.http}/v1/nothing", b"{}", 404, "no route"),
    ]
    with httpx.Client(timeout=60) as http:
        for target, content, status, message in cases:
            response = http.post(target, content=content, headers={"Content-Type": "application/json"})
            error = response.json()["error"]
            assert response.status_code == status and message in error["message"], (target, response.text)
            assert set(error) == {"message", "type", "param", "code"}
        assert http.get(f"{gateway.base_url}/chat/completions").status_code == 405
        assert pool_counts(reader) == before
        assert http.get(f"{gateway.http}/health").json() == {"status": "ok"}
        assert http.post(url, json=good).status_code == 200
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="forge-tiny", messages=good["messages"], tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "not-a-tool"}})
    assert gateway.alive()


def test_a_body_without_content_length_is_read_whole_and_bounded(stack):
    """A chunked body (no Content-Length) is joined once and refused with 413 as soon as it passes the limit."""
    gateway = stack.gateway
    good = json.dumps({"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})

    def chunks(text: str, size: int = 7):
        yield from (text[i:i + size].encode() for i in range(0, len(text), size))

    with httpx.Client(timeout=60) as http:
        url, headers = f"{gateway.base_url}/chat/completions", {"Content-Type": "application/json"}
        ok = http.post(url, content=chunks(good), headers=headers)
        assert ok.status_code == 200 and ok.request.headers.get("Transfer-Encoding") == "chunked", ok.text
        big = http.post(url, content=chunks(" " * (MAX_BODY + 1) + good, 4096), headers=headers)
        assert big.status_code == 413 and "exceeds" in big.json()["error"]["message"]
        assert http.get(f"{gateway.http}/health").json() == {"status": "ok"}


def test_a_hundred_concurrent_sessions_are_kept_apart(stack):
    gateway, reader = stack.gateway, stack.reader
    run = uuid.uuid4().hex[:8]

    def agent(i: int) -> str:
        session_id = f"c{run}-{i}"
        url = f"{gateway.http}/s/{session_id}/v1/chat/completions"
        messages = [{"role": "user", "content": f"Session {i}: compute {i} + {i}."}]
        with httpx.Client(timeout=120) as http:
            for turn in range(2):
                response = http.post(url, json={"messages": messages, "max_tokens": 4, "seed": i,
                                                "stream": turn == 1})
                assert response.status_code == 200, response.text
                if turn == 0:
                    messages += [response.json()["choices"][0]["message"], {"role": "user", "content": f"More {i}"}]
        return session_id

    with concurrent.futures.ThreadPoolExecutor(100) as pool:
        sessions = list(pool.map(agent, range(100)))
    for i, session_id in enumerate(sessions):
        calls = session_calls(reader, session_id)
        assert [c.index for c in calls] == [0, 1] and {c.session_id for c in calls} == {session_id}
        own = TOK.encode(TOK.render_chat([{"role": "user", "content": f"Session {i}: compute {i} + {i}."}],
                                         add_generation_prompt=True))
        assert list(calls[0].prompt_ids) == own
        done = own + list(calls[0].completion_ids)
        assert list(calls[1].prompt_ids[:len(done)]) == done


SCRIPTED = ('<think>Bo is in the table.</think>\nLet me look.'
            '<tool_call>{"name": "lookup", "arguments": {"key": "Bo"}}</tool_call>')


# A thinking model's template (Qwen3's 2507 thinking models, DeepSeek-R1-0528): the generation prompt opens the
# reasoning block, unless thinking is switched off (then it opens and closes an empty one).
OPENS_THINKING = "{%- if add_generation_prompt -%}{%- if enable_thinking is defined and not enable_thinking -%}" \
                 "<think>\n\n</think>\n\n{%- else -%}<think>\n{%- endif -%}{%- endif -%}"


def test_reasoning_a_template_opened_is_split_off_when_the_model_only_closes_it(tmp_path):
    """The completion carries only the closing tag; the gateway reads the open block off its rendered prompt, so
    the client gets the reasoning apart from the answer, streaming or not (and all of it as the answer when the
    template closed the block itself)."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((TINY_DIR / name).read_bytes())
    (model / "chat_template.jinja").write_text((TINY_DIR / "chat_template.jinja").read_text() + OPENS_THINKING)
    server, _servicer = serve_fake_actor("script", sampled_ids(TOK, "Bo is in the table.</think>\nLet me look."))
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool", "--model", str(model))
    try:
        assert "reasoning parser: think (the chat template writes <think>)" in gateway.log()
        client = openai.OpenAI(base_url=f"{gateway.http}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Where is Bo?"}]
        message = client.chat.completions.create(model="forge-tiny", messages=messages).choices[0].message
        assert (message.model_extra["reasoning_content"], message.content) == ("Bo is in the table.", "Let me look.")
        reasoning = content = ""
        for chunk in client.chat.completions.create(model="forge-tiny", messages=messages, stream=True):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        assert (reasoning, content) == ("Bo is in the table.", "Let me look.")
        plain = client.chat.completions.create(model="forge-tiny", messages=messages, extra_body={
            "chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
        assert plain.content == "Bo is in the table.</think>\nLet me look."
        assert not plain.model_extra.get("reasoning_content")
    finally:
        gateway.stop()
        server.stop(0)


def test_tool_calls_and_reasoning_reach_the_openai_client_and_splice_back(tmp_path):
    """A scripted actor samples a tool call with reasoning (split into non-canonical tokens, as a sampler may):
    the client gets them parsed, streaming or not, and the assistant message it sends back splices exactly."""
    sampled = sampled_ids(TOK, SCRIPTED)
    assert TOK.encode(TOK.decode(sampled)) != sampled
    server, servicer = serve_fake_actor("script", sampled)
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        client = openai.OpenAI(base_url=f"{gateway.http}/s/tools/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Who owns Bo?"}]
        reply = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS)
        message, choice = reply.choices[0].message, reply.choices[0]
        assert choice.finish_reason == "tool_calls" and message.content == "Let me look."
        assert message.model_extra["reasoning_content"] == "Bo is in the table."
        call = message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("lookup", '{"key": "Bo"}')

        stream = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS, stream=True)
        content, reasoning, calls, finish = "", "", [], None
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            calls += delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
        assert (content, reasoning, finish) == ("Let me look.", "Bo is in the table.", "tool_calls")
        assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [(0, "lookup", '{"key": "Bo"}')]

        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Mai"}]
        again = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS)
        assert again.model_extra["forge"] == {"session_id": "tools", "call_index": 2, "tito": "splice"}
        with PoolReader(tmp_path / "pool") as reader:
            first, _, third = reader.get_session("tools").calls
        assert list(first.completion_ids) == sampled and list(first.weight_versions) == [7] * len(sampled)
        assert list(third.prompt_ids[:len(first.prompt_ids) + len(sampled)]) == list(first.prompt_ids) + sampled
        assert servicer.prompts[-1] == list(third.prompt_ids)
        # Only the streaming call asks for chunks on the way; the others take the first token and then the rest.
        assert servicer.stream_intervals == [WHOLE_ANSWER, 0, WHOLE_ANSWER]
    finally:
        gateway.stop()
        server.stop(0)


def test_a_client_that_goes_away_mid_stream_aborts_the_call_and_leaves_no_record(stack):
    gateway, reader = stack.gateway, stack.reader
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        before = http.get(f"{gateway.http}/v1/stats").json()["gauges"]
        with http.stream("POST", f"{gateway.http}/s/gone-away/v1/chat/completions", json=body) as response:
            next(response.iter_lines())

        def aborted() -> dict | None:
            gauges = http.get(f"{gateway.http}/v1/stats").json()["gauges"]
            return gauges if gauges["in_flight"] == 0 and gauges["client_disconnects"] > before["client_disconnects"] \
                else None

        gauges = wait_for(aborted, "the call the client left to be aborted")
        assert gauges["in_flight"] == 0 and gauges["client_disconnects"] == before["client_disconnects"] + 1
        assert gauges["calls"] == before["calls"]
    with pytest.raises(NotFoundError):
        reader.get_session("gone-away")


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_outside_any_session_closes_the_session_it_opened(stack, stream):
    """A bare OpenAI call (no session in the path or headers) is recorded in a session of its own, which is closed
    as the call ends: left open, it would hold the learner's queue until the session timeout."""
    gateway, reader = stack.gateway, stack.reader
    body = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": stream}
    with httpx.Client(timeout=60) as http:
        response = http.post(f"{gateway.http}/v1/chat/completions", json=body)
        _ = response.read()
    assert response.status_code == 200, response.text
    session_id = response.headers["X-Forge-Session-Id"]
    wait_for(lambda: reader.get_session(session_id).session.status != pool_pb2.SESSION_STATUS_OPEN,
             "the one-call session to be closed")
    stored = reader.get_session(session_id)
    assert stored.session.status == pool_pb2.SESSION_STATUS_FAILED and len(stored.calls) == 1
    assert "outside any session" in stored.session.failure_reason


def chat(gateway, **body) -> dict:
    body = {"model": "forge-tiny", "messages": [{"role": "user", "content": "Count to ten."}], **body}
    response = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_n_answers_to_one_prompt_are_n_calls_of_the_session(stack):
    """n = 3, streamed or not: three choices, each recorded as a call of the session with its own seed, all from the
    same prompt, and each as the learner recomputes it."""
    gateway, reader = stack.gateway, stack.reader
    session = f"{gateway.http}/s/three-answers/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 5, "seed": 7, "n": 3,
            "temperature": 1.0, "return_token_ids": True}
    whole = httpx.post(session, json=body, timeout=60).json()
    # each answer is recorded when it ends, so which call holds which choice depends on which ended first
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2] and sorted(whole["forge"]["call_indexes"]) == [0, 1, 2]
    assert whole["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in whole["choices"])
    with httpx.stream("POST", session, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                      timeout=60) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    streamed = {i: [t for c in chunks for ch in c["choices"] if ch["index"] == i for t in ch.get("token_ids") or []]
                for i in range(3)}
    assert chunks[-1]["usage"]["completion_tokens"] == sum(len(ids) for ids in streamed.values())
    assert len({c["id"] for c in chunks}) == 1
    calls = session_calls(reader, "three-answers")
    assert len(calls) == 6 and len({tuple(c.prompt_ids) for c in calls}) == 1
    assert sorted(c.sampling.seed for c in calls) == [7, 7, 8, 8, 9, 9]
    by_seed = {c.sampling.seed: list(c.completion_ids) for c in calls[:3]}
    assert [by_seed[7 + i] for i in range(3)] == [c["token_ids"] for c in whole["choices"]]
    assert [list(calls[i].completion_ids) for i in whole["forge"]["call_indexes"]] == \
        [c["token_ids"] for c in whole["choices"]], "forge.call_indexes names each choice's call"
    learner, recorded = learner_and_recorded(stack.directory / "random-tiny", calls)
    torch.testing.assert_close(learner, recorded, atol=1e-5, rtol=0)


def test_n_answers_outside_a_session_close_their_session_once_all_end(stack):
    answer = chat(stack.gateway, n=2, max_tokens=3)
    session_id = answer["forge"]["session_id"]
    stored = stack.reader.get_session(session_id)
    assert len(stored.calls) == 2 and stored.session.status == pool_pb2.SESSION_STATUS_FAILED


def test_min_tokens_keeps_the_stop_ids_out_of_the_first_tokens(stack):
    gateway, reader = stack.gateway, stack.reader
    free = chat(gateway, temperature=0, max_tokens=8, ignore_eos=True, return_token_ids=True)
    stops = free["choices"][0]["token_ids"][:3]       # greedy decoding stops on its first token with these
    early = chat(gateway, temperature=0, max_tokens=8, stop_token_ids=stops, return_token_ids=True)
    assert len(early["choices"][0]["token_ids"]) == 1 and early["choices"][0]["finish_reason"] == "stop"
    for temperature in (0, 1.0):
        answer = chat(gateway, temperature=temperature, seed=3, max_tokens=8, stop_token_ids=stops, min_tokens=6,
                      logprobs=True, return_token_ids=True)
        ids = answer["choices"][0]["token_ids"]
        assert len(ids) >= 6 and not set(ids[:6]) & set(stops)
        recorded = session_calls(reader, answer["forge"]["session_id"])[0]
        assert recorded.sampling.min_tokens == 6 and list(recorded.completion_ids) == ids
        assert list(recorded.logprobs) == pytest.approx(
            [t["logprob"] for t in answer["choices"][0]["logprobs"]["content"]], abs=1e-6)


def test_top_logprobs_are_the_actors_and_hold_the_sampled_tokens(stack):
    actor, gateway, reader = stack.actor, stack.gateway, stack.reader
    # top_k 5: the sampled token is always among the 5 most likely, whose probabilities add up to 1.
    body = {"temperature": 1.0, "top_k": 5, "seed": 9, "max_tokens": 8, "ignore_eos": True, "logprobs": True,
            "top_logprobs": 5, "return_token_ids": True}
    answer = chat(gateway, **body)
    content = answer["choices"][0]["logprobs"]["content"]
    recorded = session_calls(reader, answer["forge"]["session_id"])[0]
    assert recorded.sampling.top_logprobs == 5
    with grpc.insecure_channel(actor.address) as channel:
        chunks = list(actor_pb2_grpc.ActorStub(channel).Generate(
            actor_pb2.GenerateRequest(prompt_ids=recorded.prompt_ids, sampling=recorded.sampling), timeout=60))
    own = [top for chunk in chunks for top in chunk.top_logprobs]
    assert [t for c in chunks for t in c.token_ids] == answer["choices"][0]["token_ids"] and len(own) == len(content)
    seen = 0
    for entry, top in zip(content, own, strict=True):
        alternatives = entry["top_logprobs"]
        values = [a["logprob"] for a in alternatives]
        assert len(alternatives) == 5 and values == sorted(values, reverse=True)
        assert values == pytest.approx(list(top.logprobs), abs=1e-6)
        assert [bytes(a["bytes"]) for a in alternatives] == [INFO.token_bytes(t) for t in top.token_ids]
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
        for alternative in alternatives:
            if alternative["bytes"] == entry["bytes"]:
                assert alternative["logprob"] == pytest.approx(entry["logprob"], abs=1e-6)
                seen += 1
    assert seen >= len(content)
    streamed = httpx.post(f"{gateway.base_url}/chat/completions", timeout=60, json={
        "model": "forge-tiny", "messages": [{"role": "user", "content": "Count to ten."}], **body, "stream": True})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    tops = [e["top_logprobs"] for ev in events for c in ev["choices"] if c.get("logprobs")
            for e in c["logprobs"]["content"]]
    assert tops == [e["top_logprobs"] for e in content]


def test_chat_template_kwargs_reach_the_template(stack):
    gateway, reader = stack.gateway, stack.reader
    messages = [{"role": "user", "content": "Count to ten."}]
    plain = httpx.post(f"{gateway.http}/tokenize", json={"model": "forge-tiny", "messages": messages}).json()
    off = httpx.post(f"{gateway.http}/tokenize", json={"model": "forge-tiny", "messages": messages,
                                                       "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert plain["tokens"] == TOK.encode(TOK.render_chat(messages, add_generation_prompt=True))
    assert TOK.decode(off["tokens"]) == TOK.decode(plain["tokens"]) + "<think>\n\n</think>\n\n"
    answer = chat(gateway, max_tokens=2, chat_template_kwargs={"enable_thinking": False}, return_token_ids=True)
    assert answer["prompt_token_ids"] == off["tokens"]
    assert list(session_calls(reader, answer["forge"]["session_id"])[0].prompt_ids) == off["tokens"]
    assert chat(gateway, max_tokens=2, chat_template_kwargs={"enable_thinking": True},
                return_token_ids=True)["prompt_token_ids"] == plain["tokens"]


@pytest.mark.parametrize("field, value", [
    ("repetition_penalty", 2.5), ("min_p", 0.1), ("presence_penalty", 2.5), ("frequency_penalty", -3),
    ("logit_bias", {"5": 101}), ("logit_bias", {"1024": 1}), ("guided_json", {"type": "object"}),
    ("guided_regex", "a+"), ("guided_choice", ["a", "b"]), ("guided_grammar", "root ::= 'a'"),
    ("structured_outputs", {"json": {}}), ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
    ("response_format", {"type": "regex"}), ("best_of", 2), ("use_beam_search", True),
    ("prompt_logprobs", 1), ("echo", True), ("skip_special_tokens", False), ("add_generation_prompt", False),
    ("chat_template", "{{ messages }}"), ("functions", []), ("no_such_field", 1),
    ("max_tokens", 10**6), ("max_completion_tokens", 2048), ("min_tokens", 9), ("top_logprobs", 21),
    ("chat_template_kwargs", {"messages": []}), ("chat_template_kwargs", {"eos_token": "x"}),
])
def test_parameters_the_gateway_does_not_implement_are_refused_by_name(stack, field, value):
    gateway, reader = stack.gateway, stack.reader
    body = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "logprobs": True, field: value}
    if field == "min_tokens":
        body["max_tokens"] = 8
        body["min_tokens"] = 9
    before = pool_counts(reader)
    response = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field and field in error["message"], response.text
    assert error["type"] == "invalid_request_error" and pool_counts(reader) == before


def test_neutral_values_of_refused_parameters_are_accepted(stack):
    gateway = stack.gateway
    assert chat(gateway, max_tokens=2, repetition_penalty=1, min_p=0, presence_penalty=0.0, logit_bias={},
                guided_json=None, response_format={"type": "text"}, user="agent-7", parallel_tool_calls=True)


def test_a_session_url_serves_whatever_model_name_a_program_hard_codes(stack):
    gateway, reader = stack.gateway, stack.reader
    session_id = f"named-{uuid.uuid4().hex}"
    session = openai.OpenAI(base_url=f"{gateway.http}/s/{session_id}/v1", api_key="unused", max_retries=0)
    reply = session.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=2)
    assert reply.model == "forge-tiny" and reply.model_extra["forge"]["session_id"] == session_id
    assert len(session_calls(reader, session_id)) == 1
    assert session.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"


def test_unknown_models_get_404_model_not_found_and_vllm_endpoints_answer(stack):
    gateway = stack.gateway
    with httpx.Client(base_url=gateway.http, timeout=60) as http:
        for method, path, body in (("POST", "/v1/chat/completions",
                                    {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
                                   ("GET", "/v1/models/gpt-4o", None),
                                   ("POST", "/tokenize", {"model": "gpt-4o", "prompt": "hi"}),
                                   ("POST", "/detokenize", {"model": "gpt-4o", "tokens": [1]})):
            response = http.request(method, path, json=body)
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"] == {"message": "The model `gpt-4o` does not exist.",
                                                "type": "invalid_request_error", "param": "model",
                                                "code": "model_not_found"}
        listed = http.get("/v1/models").json()["data"][0]
        assert http.get("/v1/models/forge-tiny").json() == listed
        # The model's own id (here a directory, slashes and all) is served too.
        assert http.get(f"/v1/models/{quote(listed['root'], safe='')}").json() == listed
        client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
        assert client.models.retrieve("forge-tiny").id == "forge-tiny"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert chat(gateway, model=listed["root"], max_tokens=1)["model"] == "forge-tiny"
        assert chat(gateway, model="tiny-alias", max_tokens=1)["model"] == "forge-tiny"
        assert http.get("/v1/models/tiny-alias").json() == listed

        tokens = http.post("/tokenize", json={"prompt": "Count to ten.", "return_token_strs": True}).json()
        assert tokens["tokens"] == TOK.encode("Count to ten.") and tokens["count"] == len(tokens["tokens"])
        assert tokens["max_model_len"] == listed["max_model_len"] == 2048
        assert tokens["token_strs"] == [TOK.id_to_token(t) for t in tokens["tokens"]]
        assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "Count to ten."}
        assert http.get("/version").json() == {"version": forge.__version__}
        for path, body, param in (("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {}, "prompt"),
                                  ("/tokenize", {"prompt": "a", "truncate_prompt_tokens": 3}, "truncate_prompt_tokens"),
                                  ("/detokenize", {"tokens": [5000]}, "tokens"),
                                  ("/detokenize", {"tokens": "abc"}, "tokens")):
            response = http.post(path, json=body)
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_parallel_tool_calls_false_returns_one_tool_call(tmp_path):
    two = SCRIPTED + '<tool_call>{"name": "lookup", "arguments": {"key": "Mai"}}</tool_call>'
    server, _servicer = serve_fake_actor("script", [*TOK.encode(two), TOK.eos_token_id])
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    try:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Who owns Bo and Mai?"}]
        both = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS)
        assert [json.loads(c.function.arguments)["key"] for c in both.choices[0].message.tool_calls] == ["Bo", "Mai"]
        for stream in (False, True):
            reply = client.chat.completions.create(model="forge-tiny", messages=messages, tools=TOOLS,
                                                   parallel_tool_calls=False, stream=stream)
            if stream:
                calls = [c for chunk in reply for c in (chunk.choices[0].delta.tool_calls or [])]
            else:
                calls, finish = reply.choices[0].message.tool_calls, reply.choices[0].finish_reason
                assert finish == "tool_calls"
            assert [json.loads(c.function.arguments)["key"] for c in calls] == ["Bo"]
    finally:
        gateway.stop()
        server.stop(0)


def test_integers_beyond_int32_surrogates_and_odd_headers_are_400s_naming_the_parameter(stack):
    gateway, reader = stack.gateway, stack.reader
    url = f"{gateway.base_url}/chat/completions"
    good = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    opened = httpx.post(f"{gateway.http}/v1/sessions", json={}).json()["session"]["session_id"]
    before = pool_counts(reader)
    cases = [
        ({**good, "top_k": 2**40}, {}, "top_k"),
        ({**good, "stop_token_ids": [2**40]}, {}, "stop_token_ids"),
        ({**good, "temperature": 1e-50}, {}, "temperature"),            # float32 would make it greedy 0
        ({**good, "top_p": 1e-300}, {}, "top_p"),                       # float32 would make it 0, meaning 1
        ({**good, "temperature": 10**400}, {}, "temperature"),          # no float can hold it
        ({**good, "messages": [{"role": "user", "content": "\ud800"}]}, {}, "messages[0].content"),
        ({**good, "messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]}, {},
         "messages[0].content[0].text"),
        ({**good, "stop": ["\udc80"]}, {}, "stop[0]"),
        ({**good, "messages": [{"role": "user", "content": "hi", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, {},
         "messages[0].tool_calls"),
        ({**good, "tools": [{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}]}, {},
         "tools[0].function.parameters"),
        (good, {"X-Forge-Group-Size": str(2**40), "X-Forge-Group-Id": "g"}, "X-Forge-Group-Size"),
        (good, {"X-Forge-Group-Size": "\u00b2".encode()}, "X-Forge-Group-Size"),
        (good, {"X-Forge-Task-Id": b"\xff\xfe"}, "X-Forge-Task-Id"),
        (good, {"X-Forge-Session-Id": b"s\xed\xa0\x80"}, SESSION_HEADER),
    ]
    with httpx.Client(timeout=60) as http:
        for body, headers, param in cases:
            response = http.post(url, content=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.text)
        for path, body, param in ((f"/v1/sessions/{opened}/rewards", {"call_index": 2**40, "reward": 1}, "call_index"),
                                  (f"/v1/sessions/{opened}/rewards", {"call_index": 0, "reward": 10**400}, "reward"),
                                  (f"/v1/sessions/{opened}/end", {"outcome_rewards": {"a": 10**400}},
                                   "outcome_rewards"),
                                  ("/v1/sessions", {"group_size": 2**40, "group_id": "g"}, "group_size"),
                                  ("/v1/sessions", {"task_id": "\ud800"}, "task_id"),
                                  ("/v1/sessions", {"metadata": {"k\udfff": "v"}}, "metadata")):
            response = http.post(f"{gateway.http}{path}", content=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, (path, response.text)
        assert pool_counts(reader) == before
        # both front ends accept the developer role; 0.01 survives its float32 rounding
        developer = {**good, "messages": [{"role": "developer", "content": "Be brief."},
                                          {"role": "user", "content": "hi"}], "temperature": 0.01}
        assert http.post(url, json=developer).status_code == 200
    assert "Traceback" not in gateway.log()


def test_a_call_the_pool_would_refuse_leaves_no_session_behind(tmp_path):
    """An actor's completion the pool cannot record (here a -inf log-probability) fails the call before the session
    it would have opened is opened: no empty open session, no queue entry, whichever way the session was named."""
    server, _servicer = serve_fake_actor("script", TOK.encode("no"), logprob=float("-inf"))
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool")
    reader = PoolReader(tmp_path / "pool")
    try:
        body = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        explicit = httpx.post(f"{gateway.http}/v1/sessions", json={}).json()["session"]["session_id"]
        before = reader.stats()["sessions"], [e.position for e in reader.entries(0, 1000)]
        with httpx.Client(timeout=60) as http:
            for path, headers in (("/v1/chat/completions", {}),
                                  ("/s/implicit-one/v1/chat/completions", {}),
                                  ("/v1/chat/completions", {SESSION_HEADER: "implicit-two"}),
                                  ("/v1/chat/completions", {SESSION_HEADER: "grouped", "X-Forge-Group-Id": "g",
                                                            "X-Forge-Group-Size": "2"})):
                for stream in (False, True):
                    response = http.post(f"{gateway.http}{path}", json={**body, "stream": stream}, headers=headers)
                    assert response.status_code == 502 and "cannot be recorded" in response.text, response.text
            response = http.post(f"{gateway.http}/s/{explicit}/v1/chat/completions", json=body)
            assert response.status_code == 502
        assert (reader.stats()["sessions"], [e.position for e in reader.entries(0, 1000)]) == before
        assert reader.stats()["sessions_open"] == 1 and reader.get_session(explicit).session.num_calls == 0
        for session_id in ("implicit-one", "implicit-two", "grouped"):
            with pytest.raises(NotFoundError):
                reader.get_session(session_id)
        assert "Traceback" not in gateway.log()
    finally:
        reader.close()
        gateway.stop()
        server.stop(0)
