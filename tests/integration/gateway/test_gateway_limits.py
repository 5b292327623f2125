"""Prompts too long for the model's context, against a real gateway: refused as ``context_length_exceeded`` from
cheap bounds (message text, rendered text) before they are tokenised, on both front ends, while the gateway keeps
answering everyone else. (The bound itself: unit/test_gateway_limits.py.)"""

from __future__ import annotations

import itertools
import json
import threading

import grpc
import httpx
import pytest

from forge.assets import TINY_DIR
from forge.gateway.modelinfo import ModelInfo
from forge.gateway.off_loop import PROCESS_SIZE
from forge.pool import PoolReader
from forge.tokenizer import Tokenizer
from forge.v1 import gateway_pb2, gateway_pb2_grpc

TOK = Tokenizer.from_dir(TINY_DIR)
MODEL = ModelInfo.load("tiny")
LIMIT = MODEL.max_prompt_chars                  # (context - 1) x the longest piece of the vocabulary
TEN_MB = 10 * 1000 * 1000
LONGEST_PIECE = max(TOK.backend.get_vocab(with_added_tokens=True), key=len)     # one token, every time


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def body(messages: list[dict], **extra: object) -> bytes:
    return json.dumps({"model": "forge-tiny", "messages": messages, "max_tokens": 1, **extra}).encode()


def calls_in_pool(pool) -> float:
    with PoolReader(pool) as reader:
        return reader.stats()["calls"]


def post(http: httpx.Client, gateway, content: bytes) -> httpx.Response:
    return http.post(f"{gateway.http}/v1/chat/completions", content=content,
                     headers={"Content-Type": "application/json"})


def test_ten_megabyte_prompts_are_refused_as_too_long_on_both_front_ends(stack):
    gateway, pool = stack.gateway, stack.pool       # the default 16 MiB body limit
    before = calls_in_pool(pool)
    cases = [
        (body([user("word " * (TEN_MB // 5))]), "the text of the messages has"),
        # assistant text is not counted before rendering (templates may drop it): the rendering stops instead
        (body([user("hi"), {"role": "assistant", "content": "x" * TEN_MB}, user("and?")]), "the prompt has at least"),
        # many small messages: their text counts before rendering
        (body([user(f"m{i}") for i in range(TEN_MB // 40)]), "the text of the messages has"),
        # many small assistant turns: rendered only until the text is too long
        (body([user("hi"), *[{"role": "assistant", "content": "ok"}] * (TEN_MB // 38)]), "the prompt has at least"),
    ]
    with httpx.Client(timeout=120) as http:
        for content, message in cases:
            assert len(content) > TEN_MB * 0.9
            response = post(http, gateway, content)
            error = response.json()["error"]
            assert response.status_code == 400 and error["code"] == "context_length_exceeded", response.text[:300]
            assert message in error["message"] and error["param"] == "messages"
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
        for messages, message in ((
                [gateway_pb2.ChatMessage(role="user", content="word " * (TEN_MB // 5))], "the text of the messages"), (
                [gateway_pb2.ChatMessage(role="user", content="hi")] +
                [gateway_pb2.ChatMessage(role="assistant", content="ok")] * (TEN_MB // 20),
                "the prompt has at least")):
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, messages=messages), timeout=120))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
        ids = gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=[5] * (TEN_MB // 4))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(ids, timeout=120))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "the model's context" in err.value.details()
    assert calls_in_pool(pool) == before


def test_a_prompt_just_under_the_bound_is_rendered_and_runs(stack):
    gateway = stack.gateway
    empty = TOK.render_chat([user("")], add_generation_prompt=True)
    markup, markup_tokens = len(empty), len(TOK.encode(empty))
    fits = LONGEST_PIECE * (MODEL.context_length - 1 - markup_tokens)     # one token per piece, one token to spare
    rendered = TOK.render_chat([user(fits)], add_generation_prompt=True)
    assert LIMIT - markup_tokens * len(LONGEST_PIECE) < len(rendered) <= LIMIT
    with httpx.Client(timeout=120) as http:
        ok = post(http, gateway, body([user(fits)], return_token_ids=True))
        assert ok.status_code == 200, ok.text[:300]
        assert ok.json()["prompt_token_ids"] == TOK.encode(rendered)
        assert len(ok.json()["prompt_token_ids"]) < MODEL.context_length
        # the message text is under the bound, but not with the template's markup around it
        over = post(http, gateway, body([user("x" * (LIMIT - markup + 1))]))
        assert over.status_code == 400 and "the prompt has at least" in over.json()["error"]["message"]
        # under both bounds, the token count decides (and this one is tokenised)
        counted = post(http, gateway, body([user("x" * (LIMIT - markup))]))
        error = counted.json()["error"]
        assert counted.status_code == 400 and error["code"] == "context_length_exceeded"
        assert "tokens; the model's context is" in error["message"]


def test_a_large_body_that_fits_is_decoded_apart_and_runs(stack):
    """A body past the size decoded in a separate process (2 MiB, nearly all whitespace) is answered as the same
    body without the whitespace is; bad JSON, an unknown model and a lone surrogate in it are refused the same."""
    gateway = stack.gateway
    small = body([user("Compute 2 + 2.")], seed=7, return_token_ids=True)
    padding = b" " * (2 * PROCESS_SIZE)
    with httpx.Client(timeout=120) as http:
        plain, padded = post(http, gateway, small), post(http, gateway, small[:-1] + padding + b"}")
        assert plain.status_code == padded.status_code == 200, padded.text[:300]
        fields = ("prompt_token_ids", "choices")
        assert [padded.json()[f] for f in fields] == [plain.json()[f] for f in fields]
        for content, status, message in (
                (small[:-1] + padding, 400, "not valid JSON"),
                (body([user("hi")], model="other")[:-1] + padding + b"}", 404, "does not exist"),
                (json.dumps({"messages": [user("\ud800")]}).encode()[:-1] + padding + b"}", 400, "lone surrogate")):
            response = post(http, gateway, content)
            assert response.status_code == status and message in response.json()["error"]["message"]


def test_health_and_small_calls_are_answered_while_big_bodies_arrive(stack):
    """Two HTTP and two gRPC clients send 10 MB prompts in a loop; meanwhile /health and small chat calls are
    answered, and some of them begin and end while a big request is in flight (ordering by a shared counter)."""
    gateway = stack.gateway
    clock, lock = itertools.count(), threading.Lock()
    stop = threading.Event()
    flights: list[tuple[int, int]] = []
    refusals: list[str] = []

    def tick() -> int:
        with lock:
            return next(clock)

    def http_sender() -> None:
        content = body([user("word " * (TEN_MB // 5))])
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                start = tick()
                response = post(http, gateway, content)
                flights.append((start, tick()))
                refusals.append(response.json()["error"]["code"])

    def grpc_sender() -> None:
        with grpc.insecure_channel(gateway.grpc_address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            session_id = stub.StartSession(gateway_pb2.StartSessionRequest(), timeout=30).session.session_id
            request = gateway_pb2.ChatRequest(session_id=session_id, messages=[
                gateway_pb2.ChatMessage(role="user", content="word " * (TEN_MB // 5))])
            while not stop.is_set():
                start = tick()
                try:
                    list(stub.Chat(request, timeout=120))
                    refusals.append("answered")
                except grpc.RpcError as exc:
                    refusals.append(exc.code().name)
                flights.append((start, tick()))

    senders = [threading.Thread(target=t) for t in (http_sender, http_sender, grpc_sender, grpc_sender)]
    for sender in senders:
        sender.start()
    small: list[tuple[int, int]] = []
    try:
        with httpx.Client(timeout=120) as http:
            while not flights:                              # the big requests are under way
                assert http.get(f"{gateway.http}/health").json() == {"status": "ok"}
            for i in range(200):
                start = tick()
                assert http.get(f"{gateway.http}/health").json() == {"status": "ok"}
                reply = post(http, gateway, body([user(f"small {i}")]))
                assert reply.status_code == 200, reply.text[:300]
                small.append((start, tick()))
                flown = list(flights)
                if sum(any(s < a and b < e for s, e in flown) for a, b in small) >= 3:
                    break
    finally:
        stop.set()
        for sender in senders:
            sender.join()
    inside = [(a, b) for a, b in small if any(s < a and b < e for s, e in flights)]
    assert len(inside) >= 3, (small, flights)
    assert set(refusals) <= {"context_length_exceeded", "INVALID_ARGUMENT"} and len(refusals) >= 4
