"""Property tests of the gateway's input handling against one real gateway (with a real actor and pool) on loopback:
generated chat requests, session requests and gRPC messages, valid and invalid (wrong types, integers beyond
int32, lone surrogates, odd roles, odd tool schemas, odd headers, undecodable bytes) never get a 5xx or an
INTERNAL/UNKNOWN status; and a refused input leaves the pool as it was: its figures (what ``forge pool stats
--json`` prints) and its queue entries are the same before and after."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from forge.pool import PoolReader
from forge.rpc import connect
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, pool_pb2

from helpers.waiting import wait_for

KEY = "properties-global-key"
BOUNDED = settings(max_examples=8, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large])
FAILURES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED)
DEEP = "\x00deep:"          # a schema placeholder, replaced by JSON nested that many levels in the sent body


GATEWAY_ARGS = ("--api-key", KEY, "--max-body-bytes", str(1 << 20))        # for the stack fixture (conftest.py)


@pytest.fixture(scope="module")
def keyed(stack):
    """An HTTP client and a gRPC channel to the stack's gateway with its key, and a session they share."""
    http = httpx.Client(base_url=stack.gateway.http, timeout=60, headers={"Authorization": f"Bearer {KEY}"})
    channel = connect(stack.gateway.grpc_address, api_key=KEY)
    main = http.post("/v1/sessions", json={"task_id": "properties"}).json()["session"]["session_id"]
    yield http, channel, main
    channel.close()
    http.close()


def pool_snapshot(reader: PoolReader) -> tuple[dict, list]:
    """The pool's figures (as ``forge pool stats --json``, less the head's age, which grows by itself) and entries."""
    figures = reader.stats()
    figures.pop("head_age_s")
    return figures, [asdict(entry) for entry in reader.entries(0, 1 << 20)]


def settle_one_call_session(reader: PoolReader, response: httpx.Response) -> None:
    """A streamed call outside any session has its session closed after the last chunk: wait for that write."""
    session_id = response.headers["X-Forge-Session-Id"]
    wait_for(lambda: reader.get_session(session_id).session.status != pool_pb2.SESSION_STATUS_OPEN,
             f"the one-call session {session_id} to be closed")


# ------------------------------------------------------------------------------------------------ strategies

TEXT = st.text(max_size=12)
ODD_TEXT = st.one_of(TEXT, st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u2028", "<|im_start|>user", "{{ x }}",
                                            "1 " * 2100, "caf\u00e9"]))
BIG = st.sampled_from([2**31 - 1, 2**31, -(2**31) - 1, 2**53, 2**63, 2**64, -(2**70), 2**100, 10**400, -(10**400)])
ODD_INT = st.one_of(st.integers(-3, 5), BIG, st.integers(-(2**70), 2**70))
ODD_NUMBER = st.one_of(ODD_INT, st.floats(allow_nan=False, allow_infinity=False),
                       st.sampled_from([1e-50, 1e-300, 1e308, 0.0099, 0.01, 100.0, 100.5, 0.5, -0.0]))
SCALAR = st.one_of(st.none(), st.booleans(), ODD_INT, ODD_NUMBER, ODD_TEXT)
ODD_VALUE = st.one_of(SCALAR, st.lists(SCALAR, max_size=3), st.dictionaries(ODD_TEXT, SCALAR, max_size=2))
ROLE = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                 st.sampled_from(["", "User", "function", "bot", "ipython"]), SCALAR)
CONTENT = st.one_of(ODD_TEXT, st.none(), ODD_VALUE,
                    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                    "text": ODD_TEXT}), max_size=2))
TOOL_CALL = st.one_of(st.fixed_dictionaries({"id": ODD_TEXT, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.one_of(TEXT, SCALAR), "arguments": st.one_of(st.just('{"k": 1}'), ODD_VALUE)})}), ODD_VALUE)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT},
                          optional={"tool_calls": st.one_of(st.lists(TOOL_CALL, max_size=2), ODD_VALUE),
                                    "name": ODD_TEXT, "tool_call_id": ODD_VALUE, "reasoning_content": ODD_TEXT}),
    ODD_VALUE)
SCHEMA = st.one_of(
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), ODD_TEXT),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3), max_leaves=8),
    st.one_of(st.integers(1, 3000), st.just(100000)).map(lambda depth: f"{DEEP}{depth}"))
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["function", "function", "code"]),
                           "function": st.fixed_dictionaries({"name": st.one_of(st.just("lookup"), ODD_TEXT, SCALAR)},
                                                             optional={"description": ODD_VALUE, "parameters": SCHEMA})}),
    ODD_VALUE)


@dataclass(frozen=True)
class Fields:
    """Strategies for the fields of a request: valid values, and odd ones (a name ``sampling.top_k`` gives field
    ``sampling`` an odd value of that kind)."""

    valid: dict
    odd: dict
    required: tuple[str, ...] = ()

    def request(self, odd: str | None = None) -> st.SearchStrategy[dict]:
        """Valid values of the required fields and of some optional ones; with ``odd``, that one is odd, so that
        it is the only odd value and the check it meets is reached."""
        base = st.fixed_dictionaries({k: self.valid[k] for k in self.required},
                                     optional={k: v for k, v in self.valid.items() if k not in self.required})
        if odd is None:
            return base
        field = odd.split(".")[0]
        return st.tuples(base, self.odd[odd]).map(lambda pair: {**pair[0], field: pair[1]})


PLAIN_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
VALID_MESSAGE = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user"]),
                                                 "content": PLAIN_TEXT}),
                          st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(PLAIN_TEXT,
                                                                                                    st.none())},
                                                optional={"tool_calls": st.lists(TOOL_CALL.filter(
                                                    lambda c: isinstance(c, dict)), max_size=1)}))
MESSAGES = st.lists(VALID_MESSAGE, max_size=2).map(lambda head: [*head, {"role": "user", "content": "hi"}])
SURROGATE = st.sampled_from(["\ud800", "a\udfffb", "\udc80x"])
ODD_MESSAGE = st.one_of(
    MESSAGE, st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer"]), "content": SURROGATE}),
    st.fixed_dictionaries({"role": ROLE, "content": st.just("hi")}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.just("hi"), "tool_calls": st.lists(
        TOOL_CALL, min_size=1, max_size=1)}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.just("hi"), "name": SURROGATE}))
ODD_MESSAGES = st.one_of(st.tuples(MESSAGES, ODD_MESSAGE, st.integers(0, 3)).map(
    lambda t: [*t[0][:t[2]], t[1], *t[0][t[2]:]]), ODD_VALUE, st.just([]))
VALID_TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["lookup", "search"]),
     "parameters": st.just({"type": "object", "properties": {"key": {"type": "string"}}})})})
RESPONSE_FORMAT = st.one_of(ODD_VALUE, st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "json_object", "json_schema", "regex"])},
    optional={"json_schema": st.one_of(ODD_VALUE, st.fixed_dictionaries(
        {"name": TEXT}, optional={"schema": st.one_of(SCHEMA, st.just({"type": "object"})), "strict": SCALAR}))}))
LOGIT_BIAS = st.one_of(ODD_VALUE, st.dictionaries(st.one_of(st.integers(-2, 1100).map(str), ODD_TEXT), ODD_NUMBER,
                                                  max_size=3))
# max_tokens: 1-2 or invalid, never large or absent (a valid call would then generate to the context length)
CHAT = Fields(
    valid={"messages": MESSAGES, "max_tokens": st.integers(1, 2), "model": st.just("forge-tiny"),
           "temperature": st.sampled_from([0, 0.01, 0.7, 1, 100]), "top_p": st.sampled_from([0.5, 1, 1e-30]),
           "top_k": st.integers(-1, 50), "seed": st.integers(0, 2**63 - 1),
           "stop_token_ids": st.lists(st.integers(0, 1023), max_size=2),
           "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2), "tools": st.lists(VALID_TOOL, max_size=2),
           "tool_choice": st.sampled_from(["auto", "none"]), "stream": st.booleans(), "logprobs": st.booleans(),
           "n": st.just(1)},
    odd={"messages": ODD_MESSAGES, "max_tokens": st.one_of(st.integers(-(2**70), 0),
                                                           st.sampled_from(["2", 1.5, True, [1], {}])),
         "model": ODD_VALUE, "temperature": ODD_NUMBER, "top_p": ODD_NUMBER, "top_k": st.one_of(BIG, ODD_INT),
         "seed": ODD_INT, "stop_token_ids": st.one_of(st.lists(st.one_of(BIG, ODD_INT), min_size=1, max_size=3),
                                                      ODD_VALUE),
         "stop": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, min_size=1, max_size=3), st.just(["x"] * 17), ODD_VALUE),
         "tools": st.one_of(st.lists(TOOL, min_size=1, max_size=2), ODD_VALUE,
                            SCHEMA.map(lambda schema: [{"type": "function", "function": {
                                "name": "lookup", "parameters": schema}}])),
         "tool_choice": st.one_of(st.sampled_from(["required", {"type": "function"}]), ODD_VALUE),
         "n": ODD_INT, "stream": SCALAR, "logprobs": SCALAR, "presence_penalty": ODD_NUMBER, "ignore_eos": SCALAR,
         "frequency_penalty": ODD_NUMBER, "repetition_penalty": ODD_NUMBER, "response_format": RESPONSE_FORMAT,
         "logit_bias": LOGIT_BIAS, "stream_options": ODD_VALUE},
    required=("messages", "max_tokens"))
ODD_HEADER = st.one_of(st.binary(max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b and b"\0" not in b),
                       st.sampled_from([b"", b"caf\xc3\xa9", b"\xff\xfe", b"\xed\xa0\x80", b"\xc2\xb2", b"99999999999"]))
HEADERS = Fields(valid={}, odd={
    "Authorization": st.one_of(st.just(f"Bearer {KEY}".encode()), ODD_HEADER.map(lambda b: b"Bearer " + b), ODD_HEADER),
    "X-Forge-Group-Size": st.one_of(st.sampled_from([b"0", b"1", b"3", b"2147483648", b"-1", b"1e3", b"\xc2\xb2"]),
                                    ODD_HEADER),
    "X-Forge-Group-Id": ODD_HEADER, "X-Forge-Task-Id": ODD_HEADER, "X-Forge-Session-Id": ODD_HEADER})
ROUTE = st.sampled_from(["one-call", "implicit", "explicit", "unknown"])


def nested_json(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def encode(body: object) -> bytes:
    """JSON text of a generated body; lone surrogates travel as \\ud800 escapes, deep schemas as nested text."""
    text, marker = json.dumps(body), json.dumps(DEEP)[:-1]
    while marker in text:
        start = text.index(marker)
        end = text.index('"', start + 1)
        depth = int(text[start + len(marker):end])
        text = text[:start] + nested_json(depth) + text[end + 1:]
    return text.encode()


def sendable(headers: dict[str, bytes]) -> dict[str, bytes]:
    """The headers an HTTP/1.1 client can send at all (no control bytes, no whitespace at either end)."""
    return {name: value for name, value in headers.items()
            if value == value.strip(b" \t") and all(c == 0x20 or 0x21 <= c != 0x7F for c in value)}


def refused_http(status: int) -> bool:
    event(f"HTTP {status}")
    assert status < 500, f"HTTP {status}"
    return status >= 400


# ------------------------------------------------------------------------------------------------ HTTP


@pytest.mark.parametrize("odd", [None, "body", *sorted(CHAT.odd), *sorted(HEADERS.odd)])
@BOUNDED
@given(data=st.data(), route=ROUTE, sid=st.uuids())
def test_http_chat_requests_never_fail_the_gateway_and_refusals_leave_the_pool_unchanged(
        stack, keyed, odd, data, route, sid):
    reader, (http, _channel, main) = stack.reader, keyed
    body = data.draw(ODD_VALUE if odd == "body" else CHAT.request(odd if odd in CHAT.odd else None), "body")
    headers = sendable(data.draw(HEADERS.request(odd if odd in HEADERS.odd else None), "headers"))
    path = {"one-call": "/v1/chat/completions", "implicit": f"/s/{sid.hex}/v1/chat/completions",
            "explicit": f"/s/{main}/v1/chat/completions", "unknown": "/v1/chat/completions"}[route]
    if route == "unknown":
        headers = {**headers, "X-Forge-Session-Id": sid.hex.encode()}
    before = pool_snapshot(reader)
    response = http.post(path, content=encode(body), headers={"Content-Type": "application/json", **headers})
    if refused_http(response.status_code):
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert pool_snapshot(reader) == before, (body, headers, response.text)
    elif route == "one-call" and "X-Forge-Session-Id" not in headers:
        settle_one_call_session(reader, response)


START = Fields(
    valid={"task_id": PLAIN_TEXT, "domain": PLAIN_TEXT, "group_size": st.integers(0, 1),
           "metadata": st.dictionaries(PLAIN_TEXT, PLAIN_TEXT, max_size=2), "issue_api_key": st.booleans()},
    odd={"task_id": st.one_of(SURROGATE, ODD_VALUE), "domain": ODD_TEXT, "group_id": ODD_TEXT,
         "group_size": st.one_of(BIG, ODD_INT),
         "metadata": st.one_of(st.dictionaries(ODD_TEXT, ODD_TEXT, max_size=2), ODD_VALUE), "issue_api_key": SCALAR,
         "session_id": ODD_TEXT})
CLOSE = Fields(
    valid={"failed": st.booleans(), "failure_reason": PLAIN_TEXT,
           "outcome_rewards": st.dictionaries(PLAIN_TEXT, st.floats(-1, 1), max_size=2)},
    odd={"failed": SCALAR, "failure_reason": ODD_VALUE,
         "outcome_rewards": st.one_of(st.dictionaries(ODD_TEXT, ODD_NUMBER, min_size=1, max_size=2), ODD_VALUE),
         "metrics": st.one_of(st.dictionaries(ODD_TEXT, ODD_NUMBER, min_size=1, max_size=2), ODD_VALUE)})
REWARD = Fields(valid={"call_index": st.integers(0, 2), "reward": st.floats(-1, 1)},
                odd={"call_index": st.one_of(BIG, ODD_VALUE), "reward": ODD_NUMBER}, required=("call_index", "reward"))
SESSION_CASES = [(kind, odd) for kind, fields in (("start", START), ("end", CLOSE), ("reward", REWARD))
                 for odd in (None, "body", *sorted(fields.odd))]


@pytest.mark.parametrize(("kind", "odd"), SESSION_CASES)
@BOUNDED
@given(data=st.data(), target=st.sampled_from(["fresh", "unknown", "odd"]))
def test_http_session_requests_never_fail_the_gateway_and_refusals_leave_the_pool_unchanged(
        stack, keyed, kind, odd, data, target):
    reader, (http, _channel, _main) = stack.reader, keyed
    fields = {"start": START, "end": CLOSE, "reward": REWARD}[kind]
    body = data.draw(ODD_VALUE if odd == "body" else fields.request(odd), "body")
    session_id = {"fresh": None, "unknown": uuid.uuid4().hex, "odd": "%ED%A0%80" + "x" * 300}[target]
    if session_id is None:
        session_id = http.post("/v1/sessions", json={}).json()["session"]["session_id"]
    path = {"start": "/v1/sessions", "end": f"/v1/sessions/{session_id}/end",
            "reward": f"/v1/sessions/{session_id}/rewards"}[kind]
    before = pool_snapshot(reader)
    response = http.post(path, content=encode(body), headers={"Content-Type": "application/json"})
    if refused_http(response.status_code):
        assert pool_snapshot(reader) == before, (path, body, response.text)


# ------------------------------------------------------------------------------------------------ gRPC

PROTO_TEXT = st.one_of(TEXT, st.sampled_from(["", "\x00", "<|im_start|>user", "1 " * 2100]))
INT32 = st.one_of(st.integers(-3, 5), st.integers(-(2**31), 2**31 - 1), st.sampled_from([2**31 - 1, -(2**31)]))
FLOAT = st.one_of(st.floats(width=32), st.sampled_from([0.0, 0.01, 1.0, 100.0, 1e-39, float("nan"), float("inf")]))
SCHEMA_JSON = st.one_of(st.just('{"type": "object"}'), st.just("[1]"), st.just("not json"), st.just("null"),
                        st.one_of(st.integers(1, 3000), st.just(100000)).map(nested_json), PROTO_TEXT)
GRAMMAR = st.one_of(st.builds(common_pb2.Grammar, json_schema=SCHEMA_JSON),
                    st.builds(common_pb2.Grammar, json_object=st.booleans()), st.just(common_pb2.Grammar()))
SAMPLING = Fields(
    valid={"temperature": st.sampled_from([0.0, 0.01, 0.7, 1.0, 100.0]), "top_p": st.sampled_from([0.0, 0.5, 1.0]),
           "top_k": st.integers(0, 50), "seed": st.integers(0, 2**63 - 1), "max_tokens": st.integers(1, 2),
           "stop_token_ids": st.lists(st.integers(0, 1023), max_size=2), "ignore_eos": st.booleans()},
    odd={"temperature": FLOAT, "top_p": FLOAT, "top_k": INT32, "seed": st.integers(2**63, 2**64 - 1),
         "max_tokens": st.integers(-(2**31), -1), "stop_token_ids": st.lists(INT32, min_size=1, max_size=3),
         "logit_bias": st.dictionaries(INT32, FLOAT, min_size=1, max_size=3), "frequency_penalty": FLOAT,
         "presence_penalty": FLOAT, "repetition_penalty": FLOAT, "grammar": GRAMMAR},
    required=("max_tokens",))
PROTO_MESSAGE = st.builds(
    gateway_pb2.ChatMessage, role=st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                                            PROTO_TEXT),
    content=PROTO_TEXT, name=PROTO_TEXT, tool_call_id=PROTO_TEXT, reasoning_content=PROTO_TEXT,
    tool_calls=st.lists(st.builds(gateway_pb2.ToolCall, id=PROTO_TEXT, name=PROTO_TEXT,
                                  arguments=st.one_of(st.just('{"k": 1}'), PROTO_TEXT)), max_size=1))
PROTO_MESSAGES = st.lists(st.builds(gateway_pb2.ChatMessage, role=st.sampled_from(["system", "developer", "user"]),
                                    content=PLAIN_TEXT), max_size=2).map(
    lambda head: [*head, gateway_pb2.ChatMessage(role="user", content="hi")])
PROTO_TOOL = st.builds(gateway_pb2.Tool, name=st.one_of(st.just("lookup"), PROTO_TEXT), description=PROTO_TEXT,
                       parameters_json=SCHEMA_JSON)
def sampling(odd: str | None = None) -> st.SearchStrategy[common_pb2.SamplingParams]:
    return SAMPLING.request(odd).map(lambda fields: common_pb2.SamplingParams(**fields))


CHAT_REQUEST = Fields(
    valid={"messages": PROTO_MESSAGES, "sampling": sampling(),
           "tools": st.lists(st.just(gateway_pb2.Tool(name="lookup", parameters_json='{"type": "object"}')),
                             max_size=1),
           "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2),
           "tool_choice": st.sampled_from(["", "auto", "none"])},
    odd={"messages": st.one_of(st.lists(PROTO_MESSAGE, max_size=3), st.tuples(PROTO_MESSAGES, PROTO_MESSAGE).map(
             lambda t: [t[1], *t[0]])),
         "tools": st.lists(PROTO_TOOL, min_size=1, max_size=2),
         "stop": st.one_of(st.lists(PROTO_TEXT, min_size=1, max_size=3), st.just(["x"] * 17)),
         "tool_choice": st.sampled_from(["required", "lookup", "AUTO"]),
         **{f"sampling.{name}": sampling(name) for name in SAMPLING.odd}},
    required=("messages", "sampling"))
GRPC_CASES = [*(("chat", odd) for odd in (None, *sorted(CHAT_REQUEST.odd))),
              *(("generate", odd) for odd in (None, *sorted(SAMPLING.odd))),
              *((kind, None) for kind in ("reward", "start", "end", "raw"))]
METHODS = {"StartSession": False, "EndSession": False, "Chat": True, "Generate": True, "AddReward": False,
           "Stats": False}


def grpc_outcome(call) -> grpc.StatusCode:
    """The status of a call (``call()`` makes it and reads any stream to its end)."""
    try:
        call()
    except grpc.RpcError as exc:
        event(exc.code().name)
        assert exc.code() not in FAILURES, (exc.code(), exc.details())
        return exc.code()
    event("OK")
    return grpc.StatusCode.OK


@pytest.mark.parametrize(("kind", "odd"), GRPC_CASES)
@BOUNDED
@given(data=st.data(), target=st.sampled_from(["main", "unknown", ""]),
       prompt=st.one_of(st.lists(st.integers(0, 1023), min_size=1, max_size=4), st.lists(INT32, max_size=4)),
       index=INT32, reward=FLOAT, rewards=st.dictionaries(PROTO_TEXT, FLOAT, max_size=2),
       opening=st.builds(gateway_pb2.StartSessionRequest, task_id=PROTO_TEXT, group_id=PROTO_TEXT,
                         group_size=st.one_of(st.integers(0, 3), INT32),
                         metadata=st.dictionaries(PROTO_TEXT, PROTO_TEXT, max_size=2), issue_api_key=st.booleans()),
       method=st.sampled_from(sorted(METHODS)), raw=st.binary(max_size=48))
def test_grpc_messages_never_fail_the_gateway_and_refusals_leave_the_pool_unchanged(
        stack, keyed, kind, odd, data, target, prompt, index, reward, rewards, opening, method, raw):
    reader, (http, channel, main) = stack.reader, keyed
    stub = gateway_pb2_grpc.GatewayStub(channel)
    session_id = {"main": main, "unknown": uuid.uuid4().hex, "": ""}[target]
    if kind == "end" and target == "main":      # keep the main session open for the other examples
        session_id = http.post("/v1/sessions", json={}).json()["session"]["session_id"]
    if kind == "chat":
        chat = gateway_pb2.ChatRequest(session_id=session_id, **data.draw(CHAT_REQUEST.request(odd), "chat"))
    generating = gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=prompt,
                                                    sampling=data.draw(sampling(odd if kind == "generate" else None), "sampling"))
    calls = {
        "chat": lambda: list(stub.Chat(chat, timeout=60)),
        "generate": lambda: list(stub.Generate(generating, timeout=60)),
        "reward": lambda: stub.AddReward(gateway_pb2.AddRewardRequest(session_id=session_id, call_index=index,
                                                                      reward=reward), timeout=60),
        "start": lambda: stub.StartSession(opening, timeout=60),
        "end": lambda: stub.EndSession(gateway_pb2.EndSessionRequest(session_id=session_id, outcome_rewards=rewards,
                                                                     metrics=rewards), timeout=60),
        "raw": lambda: raw_call(channel, method, raw),
    }
    before = pool_snapshot(reader)
    if grpc_outcome(calls[kind]) != grpc.StatusCode.OK:
        assert pool_snapshot(reader) == before, kind


def raw_call(channel: grpc.Channel, method: str, raw: bytes) -> object:
    identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
    full = f"/forge.v1.Gateway/{method}"
    if METHODS[method]:
        return list(channel.unary_stream(full, **identity)(raw, timeout=60))
    return channel.unary_unary(full, **identity)(raw, timeout=60)


def test_the_sent_bodies_carry_surrogates_and_deep_schemas_as_meant():
    assert encode({"parameters": f"{DEEP}2"}) == b'{"parameters": {"a": {"a": 1}}}'
    assert encode({"content": "\ud800"}) == b'{"content": "\\ud800"}'


def test_the_gateway_logged_no_traceback(stack):
    gateway = stack.gateway
    assert gateway.alive() and "Traceback" not in gateway.log()
