"""The gateway's gRPC front end (white-box agents) against real processes, and API keys on both front ends:
global keys and per-session keys, over HTTP and gRPC."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from forge.assets import TINY_DIR
from forge.pool import PoolReader
from forge.rpc import connect
from forge.tokenizer import Tokenizer
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from helpers.gateway_procs import start_gateway
from helpers.waiting import wait_for

TOK = Tokenizer.from_dir(TINY_DIR)
GLOBAL_KEY = "gw-global-key-123"


@pytest.fixture(scope="module")
def gateway(tiny_actor, tmp_path_factory):
    directory = tmp_path_factory.mktemp("gateway-grpc")
    proc = start_gateway(directory, [tiny_actor.address], directory / "pool")
    proc.pool_path = directory / "pool"
    yield proc
    proc.stop()


def user(text: str) -> gateway_pb2.ChatMessage:
    return gateway_pb2.ChatMessage(role="user", content=text)


def test_chat_generate_rewards_and_stats_over_grpc(tiny_actor, gateway):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        started = stub.StartSession(gateway_pb2.StartSessionRequest(task_id="w1", domain="qa", group_id="g",
                                                                    group_size=1), timeout=30)
        session_id = started.session.session_id
        assert started.base_url == f"{gateway.http}/s/{session_id}/v1" and not started.api_key
        messages = [gateway_pb2.ChatMessage(role="system", content="Be short."), user("What is 4 + 4?")]
        request = gateway_pb2.ChatRequest(session_id=session_id, messages=messages,
                                          sampling=common_pb2.SamplingParams(max_tokens=6, seed=4))
        chunks = list(stub.Chat(request, timeout=60))
        last = chunks[-1]
        assert last.finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
        assert all(c.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
        ids = [t for c in chunks for t in c.token_ids]
        assert last.call_index == 0 and last.completion_tokens == len(ids)
        text = "".join(c.text for c in chunks)
        assert last.content == text and text == TOK.decode(ids[:-1] if last.finish_reason == 1 else ids)

        prompt = TOK.encode("<|im_start|>user\nCount: 1 2 3")
        call = stub.Generate(gateway_pb2.SessionGenerateRequest(
            session_id=session_id, prompt_ids=prompt, sampling=common_pb2.SamplingParams(max_tokens=5, seed=1)),
            timeout=60)
        generated = list(call)
        assert dict(call.trailing_metadata())["forge-call-index"] == "1"
        generated_ids = [t for c in generated for t in c.token_ids]
        assert len(generated_ids) == 5 and generated[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH

        stub.AddReward(gateway_pb2.AddRewardRequest(session_id=session_id, call_index=0, reward=0.25), timeout=30)
        ended = stub.EndSession(gateway_pb2.EndSessionRequest(session_id=session_id, outcome_rewards={"ok": 1.0},
                                                              metrics={"steps": 2}), timeout=30)
        assert ended.status == 2 and ended.num_calls == 2

        report = stub.Stats(common_pb2.StatsRequest(), timeout=30)
        assert report.service == "gateway" and report.gauges["calls"] >= 2
        for name in ("sessions_open", "calls_per_s", "latency_ms_p50", "latency_ms_p99", "errors", "tito_splices",
                     "tito_fallbacks", f"actor_in_flight/{tiny_actor.address}"):
            assert name in report.gauges, name
        assert report.labels["grpc_address"] == gateway.grpc_address

    with PoolReader(gateway.pool_path) as reader:
        stored = reader.get_session(session_id)
    chat, generate = stored.calls
    assert list(chat.completion_ids) == ids and list(chat.process_rewards) == [0.25]
    assert chat.logprobs == pytest.approx([p for c in chunks for p in c.logprobs], abs=1e-6)
    assert list(generate.prompt_ids) == prompt and list(generate.completion_ids) == generated_ids
    assert stored.session.outcome_rewards["ok"] == 1.0 and stored.session.metrics["steps"] == 2


def test_grpc_errors_are_statuses_with_messages(gateway):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        ok = [user("hi")]
        cases = [
            (stub.Chat, gateway_pb2.ChatRequest(session_id="nope", messages=ok), grpc.StatusCode.NOT_FOUND,
             "unknown session"),
            (stub.Chat, gateway_pb2.ChatRequest(messages=ok), grpc.StatusCode.INVALID_ARGUMENT, "session_id"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id), grpc.StatusCode.INVALID_ARGUMENT,
             "messages"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=ok,
                                                sampling=common_pb2.SamplingParams(temperature=-1)),
             grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=[user("1 " * 2100)]),
             grpc.StatusCode.INVALID_ARGUMENT, "context"),
            (stub.Generate, gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=[5, 99999]),
             grpc.StatusCode.INVALID_ARGUMENT, "vocabulary [0, 1024): [99999]"),
            (stub.Generate, gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=[-1, 5, -2]),
             grpc.StatusCode.INVALID_ARGUMENT, "vocabulary [0, 1024): [-1, -2]"),
            (stub.Generate, gateway_pb2.SessionGenerateRequest(session_id=session_id),
             grpc.StatusCode.INVALID_ARGUMENT, "empty"),
            (stub.AddReward, gateway_pb2.AddRewardRequest(session_id=session_id, call_index=3, reward=1),
             grpc.StatusCode.NOT_FOUND, "no call 3"),
            (stub.AddReward, gateway_pb2.AddRewardRequest(session_id=session_id, reward=float("nan")),
             grpc.StatusCode.INVALID_ARGUMENT, "finite"),
            (stub.EndSession, gateway_pb2.EndSessionRequest(session_id="nope"), grpc.StatusCode.NOT_FOUND,
             "unknown session"),
            (stub.StartSession, gateway_pb2.StartSessionRequest(group_size=2), grpc.StatusCode.INVALID_ARGUMENT,
             "group_id"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=ok,
                                                sampling=common_pb2.SamplingParams(max_tokens=5000)),
             grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=ok,
                                                sampling=common_pb2.SamplingParams(max_tokens=4, min_tokens=5)),
             grpc.StatusCode.INVALID_ARGUMENT, "min_tokens"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=ok,
                                                sampling=common_pb2.SamplingParams(top_logprobs=21)),
             grpc.StatusCode.INVALID_ARGUMENT, "top_logprobs"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=ok, chat_template_kwargs_json="["),
             grpc.StatusCode.INVALID_ARGUMENT, "chat_template_kwargs"),
            (stub.Chat, gateway_pb2.ChatRequest(session_id=session_id, messages=ok,
                                                chat_template_kwargs_json='{"tools": 1}'),
             grpc.StatusCode.INVALID_ARGUMENT, "chat_template_kwargs"),
            (stub.Generate, gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=[5],
                                                               sampling=common_pb2.SamplingParams(max_tokens=2048)),
             grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        ]
        answered_whole = {stub.Chat: stub.ChatWhole, stub.Generate: stub.GenerateWhole}
        cases += [(answered_whole[method], request, code, message) for method, request, code, message in cases
                  if method in answered_whole]          # the one-message methods refuse alike
        for method, request, code, message in cases:
            with pytest.raises(grpc.RpcError) as err:
                result = method(request, timeout=30)
                if method in (stub.Chat, stub.Generate):
                    list(result)
            assert err.value.code() == code and message in err.value.details(), (request, err.value.details())
        stub.EndSession(gateway_pb2.EndSessionRequest(session_id=session_id), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, messages=ok), timeout=30))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "completed" in err.value.details()
    with PoolReader(gateway.pool_path) as reader:
        assert reader.get_session(session_id).session.num_calls == 0


def test_chat_takes_the_openai_parameters_the_http_front_end_takes(gateway):
    """min_tokens, top_logprobs and chat template variables over gRPC, as over HTTP."""
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        free = list(stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, messages=[user("Go on.")],
                                                      sampling=common_pb2.SamplingParams(temperature=0, max_tokens=4,
                                                                                         ignore_eos=True)),
                              timeout=60))
        stops = [t for c in free for t in c.token_ids][:2]
        sampling = common_pb2.SamplingParams(temperature=1.0, top_k=4, seed=2, max_tokens=6, stop_token_ids=stops,
                                             min_tokens=5, top_logprobs=4)
        chunks = list(stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, messages=[user("Go on.")],
                                                        sampling=sampling,
                                                        chat_template_kwargs_json='{"enable_thinking": false}'),
                                timeout=60))
        ids = [t for c in chunks for t in c.token_ids]
        logprobs = [v for c in chunks for v in c.logprobs]
        tops = [top for c in chunks for top in c.top_logprobs]
        assert len(ids) >= 5 and not set(ids[:5]) & set(stops) and len(tops) == len(ids)
        for token, logprob, top in zip(ids, logprobs, tops, strict=True):
            assert len(top.token_ids) == 4 and token in top.token_ids
            assert top.logprobs[list(top.token_ids).index(token)] == pytest.approx(logprob, abs=1e-6)
    with PoolReader(gateway.pool_path) as reader:
        calls = reader.get_session(session_id).calls
    assert list(calls[1].completion_ids) == ids and calls[1].sampling.min_tokens == 5
    # The tiny template has no thinking switch: the variable reaches it and changes nothing.
    assert list(calls[1].prompt_ids) == list(calls[0].prompt_ids)


def test_a_whole_chat_is_one_chunk_equal_to_the_streamed_call(gateway):
    """``whole``, and ChatWhole: one chunk once the call is recorded, holding what the streamed call's chunks add up to
    (same seed), its ids, log-probs, versions and top log-probs as the pool records them."""
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        answers = []
        for way in ("stream", "whole", "ChatWhole"):
            session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
            sampling = common_pb2.SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True,
                                                 top_logprobs=2)
            request = gateway_pb2.ChatRequest(session_id=session_id, messages=[user("Tell a story.")],
                                              sampling=sampling, whole=way == "whole")
            chunks = [stub.ChatWhole(request, timeout=60)] if way == "ChatWhole" else list(
                stub.Chat(request, timeout=60))
            answers.append((session_id, chunks))
    (_, streamed), *answered_whole = answers
    assert len(streamed) > 1
    for whole_session, [whole] in answered_whole:
        assert list(whole.token_ids) == [t for c in streamed for t in c.token_ids]
        assert list(whole.logprobs) == pytest.approx([v for c in streamed for v in c.logprobs], abs=1e-6)
        assert list(whole.top_logprobs) == [top for c in streamed for top in c.top_logprobs]
        assert whole.text == "".join(c.text for c in streamed) and whole.content == streamed[-1].content
        assert (whole.finish_reason, whole.completion_tokens, whole.call_index) == (streamed[-1].finish_reason, 12, 0)
        with PoolReader(gateway.pool_path) as reader:
            [call] = reader.get_session(whole_session).calls
        assert list(call.completion_ids) == list(whole.token_ids) and list(call.logprobs) == list(whole.logprobs)
        assert list(call.weight_versions) == list(whole.weight_versions)


def test_a_whole_generate_is_one_chunk_of_the_whole_completion(gateway):
    """Generate with ``whole``: one chunk holding every token, the same as the streamed call's with the same seed,
    and recorded as it was."""
    prompt = TOK.encode("<|im_start|>user\nCount: 1 2 3")
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        answers = []
        for way in ("stream", "whole", "GenerateWhole"):
            session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
            sampling = common_pb2.SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
            request = gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=prompt, sampling=sampling,
                                                         whole=way == "whole")
            if way == "GenerateWhole":
                answer, call = stub.GenerateWhole.with_call(request, timeout=60)
                chunks = [answer]
            else:
                call = stub.Generate(request, timeout=60)
                chunks = list(call)
            assert dict(call.trailing_metadata())["forge-call-index"] == "0"
            answers.append((session_id, chunks))
    (_, streamed), *answered_whole = answers
    assert len(streamed) > 2
    for whole_session, whole in answered_whole:
        assert [len(c.token_ids) for c in whole] == [12]
        assert [t for c in whole for t in c.token_ids] == [t for c in streamed for t in c.token_ids]
        assert [v for c in whole for v in c.logprobs] == pytest.approx([v for c in streamed for v in c.logprobs],
                                                                       abs=1e-6)
        with PoolReader(gateway.pool_path) as reader:
            [call] = reader.get_session(whole_session).calls
        assert list(call.prompt_ids) == prompt and list(call.completion_ids) == [t for c in whole for t in c.token_ids]


def test_global_and_per_session_keys_on_both_front_ends(tiny_actor, tmp_path):
    gateway = start_gateway(tmp_path, [tiny_actor.address], tmp_path / "pool", "--api-key", GLOBAL_KEY,
                            "--api-key", "second-key")
    try:
        bearer = {"Authorization": f"Bearer {GLOBAL_KEY}"}
        with httpx.Client(base_url=gateway.http, timeout=60) as http:
            assert http.get("/health").status_code == 200
            for headers, message in (({}, "missing API key"), ({"Authorization": "Bearer wrong"}, "invalid API key")):
                response = http.get("/v1/models", headers=headers)
                assert response.status_code == 401 and response.json()["error"]["message"] == message
                assert http.post("/v1/chat/completions", headers=headers, json={}).status_code == 401
            assert http.get("/v1/models", headers={"X-Api-Key": "second-key"}).status_code == 200
            opened = http.post("/v1/sessions", headers=bearer, json={"task_id": "k"}).json()
            session_id, session_key = opened["session"]["session_id"], opened["api_key"]
            other = http.post("/v1/sessions", headers=bearer, json={}).json()["session"]["session_id"]
            own = {"Authorization": f"Bearer {session_key}"}
            assert http.post("/v1/sessions", headers=own, json={}).status_code == 403
            assert http.get("/v1/stats", headers=own).status_code == 403
            assert http.get("/v1/stats", headers=bearer).json()["gauges"]["sessions_open"] == 2
            assert http.get(f"/v1/sessions/{other}", headers=own).status_code == 403
            for method, path, body in (("GET", "/v1/models/forge-tiny", None), ("GET", "/version", None),
                                       ("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [5]})):
                assert http.request(method, path, json=body).status_code == 401, path
                assert http.request(method, path, json=body, headers=own).status_code == 200, path
            forbidden = http.post(f"/s/{other}/v1/chat/completions", headers=own,
                                  json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
            assert forbidden.status_code == 403 and "another session" in forbidden.json()["error"]["message"]

        agent = openai.OpenAI(base_url=gateway.base_url, api_key=session_key, max_retries=0)
        reply = agent.chat.completions.create(model="forge-tiny", max_tokens=3,
                                              messages=[{"role": "user", "content": "hi"}])
        assert reply.model_extra["forge"]["session_id"] == session_id
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gateway.base_url, api_key="nope", max_retries=0).models.list()

        with grpc.insecure_channel(gateway.grpc_address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                gateway_pb2_grpc.GatewayStub(channel).Stats(common_pb2.StatsRequest(), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        chat = gateway_pb2.ChatRequest(messages=[user("hi")], sampling=common_pb2.SamplingParams(max_tokens=2))
        with connect(gateway.grpc_address, api_key=session_key) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            last = list(stub.Chat(chat, timeout=60))[-1]        # the key names the session
            assert last.call_index == 1
            assert stub.ChatWhole(chat, timeout=60).call_index == 2
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Chat(gateway_pb2.ChatRequest(session_id=other, messages=chat.messages), timeout=30))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as err:
                stub.ChatWhole(gateway_pb2.ChatRequest(session_id=other, messages=chat.messages), timeout=30)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as err:
                stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert stub.EndSession(gateway_pb2.EndSessionRequest(), timeout=30).num_calls == 3
        with connect(gateway.grpc_address, api_key=GLOBAL_KEY) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            started = stub.StartSession(gateway_pb2.StartSessionRequest(issue_api_key=True), timeout=30)
            assert started.api_key.startswith("fsk_")
            assert stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges["calls"] == 3
    finally:
        gateway.stop()
    log = gateway.log()
    assert GLOBAL_KEY not in log and session_key not in log and "second-key" not in log


def test_a_cancelled_chat_stops_the_generation_and_records_nothing(gateway):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        before = stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges
        call = stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, messages=[user("go")], sampling=common_pb2.
                                                 SamplingParams(max_tokens=1500, ignore_eos=True)), timeout=60)
        next(call)
        call.cancel()

        def ended():
            gauges = stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges
            return gauges if gauges["in_flight"] == 0 else None

        gauges = wait_for(ended, "the cancelled call to end")
        assert gauges["in_flight"] == 0 and gauges["calls"] == before["calls"]
    with PoolReader(gateway.pool_path) as reader:
        assert reader.get_session(session_id).session.num_calls == 0


def test_a_cancelled_chat_whole_stops_the_generation_and_records_nothing(gateway):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        before = stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges

        def gauges_when(in_flight: int):
            def check():
                gauges = stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges
                return gauges if gauges["in_flight"] == in_flight else None
            return check

        call = stub.ChatWhole.future(gateway_pb2.ChatRequest(session_id=session_id, messages=[user("go")],
                                                             sampling=common_pb2.SamplingParams(max_tokens=1500,
                                                                                                ignore_eos=True)),
                                     timeout=60)
        wait_for(gauges_when(1), "the call to reach the actor")
        call.cancel()
        gauges = wait_for(gauges_when(0), "the cancelled call to end")
        assert gauges["calls"] == before["calls"] and call.cancelled()
    with PoolReader(gateway.pool_path) as reader:
        assert reader.get_session(session_id).session.num_calls == 0


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads thread counts from /proc (Linux)")
def test_open_grpc_calls_hold_no_gateway_thread(gateway):
    """80 Chat streams opened at once: the gateway serves them on its event loop, with no thread per call (the
    threaded gRPC server it had held one of its pool's threads for each). The random model's context bounds the
    streams' length, so the check counts what is open when the threads are counted."""
    pid = gateway.proc.pid
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        before = threads_of(pid)
        sampling = common_pb2.SamplingParams(max_tokens=1500, ignore_eos=True)
        calls = [stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, messages=[user(f"go {i}")],
                                                   sampling=sampling), timeout=120) for i in range(80)]
        for call in calls:
            next(call)                      # every stream is open and streaming
        during = threads_of(pid)
        open_calls = stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges["in_flight"]
        for call in calls:
            call.cancel()
        deadline = time.monotonic() + 60
        while stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.1)
    assert open_calls >= 40 and during - before < 20, (open_calls, before, during)


DEEP_SCHEMA = '{"a": ' * 100000 + "1" + "}" * 100000
# (name, HTTP message and tool, gRPC message and tool, accepted): the two front ends must decide alike
AGREEMENT = [
    ("developer role", {"role": "developer", "content": "Be brief."}, None,
     gateway_pb2.ChatMessage(role="developer", content="Be brief."), None, True),
    ("object schema", None, {"name": "f", "parameters": {"type": "object"}},
     None, gateway_pb2.Tool(name="f", parameters_json='{"type": "object"}'), True),
    ("reasoning on a user message (ignored)", {"role": "user", "content": "x", "reasoning_content": "r"}, None,
     gateway_pb2.ChatMessage(role="user", content="x", reasoning_content="r"), None, True),
    ("list schema", None, {"name": "f", "parameters": [1, 2]}, None, gateway_pb2.Tool(name="f", parameters_json="[1, 2]"),
     False),
    ("string schema", None, {"name": "f", "parameters": "x"}, None, gateway_pb2.Tool(name="f", parameters_json='"x"'),
     False),
    ("empty tool name", None, {"name": "", "parameters": {}}, None, gateway_pb2.Tool(name="", parameters_json="{}"),
     False),
    ("unknown role", {"role": "bot", "content": "x"}, None, gateway_pb2.ChatMessage(role="bot", content="x"), None,
     False),
    ("tool calls on a user message", {"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, None,
     gateway_pb2.ChatMessage(role="user", content="x", tool_calls=[gateway_pb2.ToolCall(id="c", name="f")]), None,
     False),
]


def test_http_and_grpc_accept_and_refuse_the_same_messages_and_tools(gateway):
    with grpc.insecure_channel(gateway.grpc_address) as channel, httpx.Client(timeout=60) as http:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        for name, http_message, http_tool, grpc_message, grpc_tool, accepted in AGREEMENT:
            messages = [*([http_message] if http_message else []), {"role": "user", "content": "hi"}]
            body = {"messages": messages, "max_tokens": 1,
                    "tools": [{"type": "function", "function": http_tool}] if http_tool else None}
            response = http.post(f"{gateway.http}/s/{session_id}/v1/chat/completions", json=body)
            request = gateway_pb2.ChatRequest(session_id=session_id, messages=[
                *([grpc_message] if grpc_message else []), user("hi")], tools=[grpc_tool] if grpc_tool else [],
                sampling=common_pb2.SamplingParams(max_tokens=1))
            try:
                list(stub.Chat(request, timeout=60))
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            assert (response.status_code == 200, code == grpc.StatusCode.OK) == (accepted, accepted), (name, response.text)
            if not accepted:
                assert response.status_code == 400 and code == grpc.StatusCode.INVALID_ARGUMENT, name


def test_grpc_bad_input_is_invalid_argument_without_a_traceback(gateway):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        deep = gateway_pb2.ChatRequest(session_id=session_id, messages=[user("hi")],
                                       tools=[gateway_pb2.Tool(name="f", parameters_json=DEEP_SCHEMA)])
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Chat(deep, timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "nested too deeply" in err.value.details()
        identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
        for method, streaming in (("Chat", True), ("Generate", True), ("ChatWhole", False), ("GenerateWhole", False),
                                  ("StartSession", False), ("AddReward", False), ("EndSession", False),
                                  ("Stats", False)):
            full = f"/forge.v1.Gateway/{method}"
            with pytest.raises(grpc.RpcError) as err:
                if streaming:
                    list(channel.unary_stream(full, **identity)(b"\xff\xff\xff\xff", timeout=30))
                else:
                    channel.unary_unary(full, **identity)(b"\xff\xff\xff\xff", timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "could not be decoded" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:      # a negative call index is no call, not a pool failure
            stub.AddReward(gateway_pb2.AddRewardRequest(session_id=session_id, call_index=-1, reward=1), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with PoolReader(gateway.pool_path) as reader:
        assert reader.get_session(session_id).session.num_calls == 0
    assert "Traceback" not in gateway.log()
