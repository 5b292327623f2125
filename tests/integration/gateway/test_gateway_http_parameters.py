"""The gateway's OpenAI-compatible HTTP front end, its request parameters, against a real actor and gateway process:
n answers, min_tokens, top_logprobs, template kwargs, refused and neutral parameters, model names, parallel tool
calls, out-of-range values and odd headers."""


from __future__ import annotations

import json
import math
import uuid
from urllib.parse import quote

import grpc
import httpx
import openai
import pytest
import torch

import forge
from forge.gateway.http.app import SESSION_HEADER
from forge.pool import NotFoundError, PoolReader
from forge.v1 import actor_pb2, actor_pb2_grpc, pool_pb2
from integration.gateway.test_gateway_http import (  # the stack fixture reads GATEWAY_ARGS, prepare_checkpoint here
    GATEWAY_ARGS,  # noqa: F401
    INFO,
    SCRIPTED,
    TOK,
    TOOLS,
    pool_counts,
    prepare_checkpoint,  # noqa: F401
    session_calls,
)

from helpers.gateway_fake_actor import serve_fake_actor
from helpers.gateway_procs import start_gateway
from helpers.recompute import learner_and_recorded


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
