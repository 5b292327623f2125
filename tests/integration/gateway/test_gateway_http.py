"""The gateway's OpenAI-compatible HTTP front end against a real actor and gateway process: a black-box agent
written only with the ``openai`` client, token-in-token-out records, stop strings, bad input, many sessions."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import uuid
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from forge.assets import TINY_DIR
from forge.gateway.modelinfo import ModelInfo
from forge.pool import NotFoundError, PoolReader
from forge.stream_interval import WHOLE_ANSWER
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2, pool_pb2

from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway
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
