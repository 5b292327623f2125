"""The gateway's key policy as one decision table, with keys configured and without: checked on the policy itself,
and through both front ends of real gateway processes (HTTP and gRPC), which must answer each row the same way."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest

from forge.gateway.auth import KeyPolicy, Operation
from forge.gateway.errors import Forbidden, GatewayError, GlobalKeyRequired, Unauthorized
from forge.gateway.keys import KeyRing
from forge.rpc.auth import bearer_metadata
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from helpers.gateway_procs import start_gateway

GLOBAL_KEY = "auth-global-key"
CHAT, GENERATE, ADD_REWARD, END_SESSION = Operation.CHAT, Operation.GENERATE, Operation.ADD_REWARD, Operation.END_SESSION
START_SESSION, STATS = Operation.START_SESSION, Operation.STATS

# (key, operation, target session, refusal). Keys: "global"; "own", the per-session key of session A; "forged", a
# key for A signed with another secret; "wrong"; None, no key. Targets are sessions A, B and C, or None (none named).
# Rows run in order: the reward on A's call 0 follows a chat on A.
Row = tuple[str | None, Operation, str | None, type[GatewayError] | None]
WITH_KEYS: list[Row] = [
    ("global", CHAT, "A", None),
    ("own", CHAT, "A", None),
    ("own", CHAT, None, None),
    ("own", CHAT, "B", Forbidden),
    ("own", ADD_REWARD, "A", None),
    ("own", ADD_REWARD, "B", Forbidden),
    ("own", END_SESSION, "B", Forbidden),
    ("own", START_SESSION, None, GlobalKeyRequired),
    ("own", STATS, None, GlobalKeyRequired),
    (None, CHAT, "A", Unauthorized),
    (None, STATS, None, Unauthorized),
    ("wrong", CHAT, "A", Unauthorized),
    ("wrong", STATS, None, Unauthorized),
    ("forged", CHAT, "A", Unauthorized),
    ("global", START_SESSION, None, None),
    ("global", STATS, None, None),
    ("global", END_SESSION, "C", None),
    ("own", END_SESSION, "A", None),
]
WITHOUT_KEYS: list[Row] = [
    (None, CHAT, "A", None),
    ("wrong", CHAT, "A", None),
    ("wrong", STATS, None, None),
    ("own", START_SESSION, None, None),
    ("own", STATS, None, None),
    ("own", CHAT, None, None),
    ("own", CHAT, "B", Forbidden),
    ("own", ADD_REWARD, "B", Forbidden),
    (None, ADD_REWARD, "A", None),
    (None, END_SESSION, "C", None),
]
TABLES = {"with keys": WITH_KEYS, "without keys": WITHOUT_KEYS}


def presented(name: str | None, session_key: str, session_id: str) -> str | None:
    forged = KeyRing(secret="not the gateway's").issue(session_id)
    return {"global": GLOBAL_KEY, "own": session_key, "forged": forged, "wrong": "wrong-key", None: None}[name]


# ------------------------------------------------------------------------------------------- the policy


@pytest.mark.parametrize("table", sorted(TABLES))
def test_the_policy_decides_each_row(table):
    ring = KeyRing([GLOBAL_KEY] if table == "with keys" else [], secret="s3cret")
    policy = KeyPolicy(ring)
    own = ring.issue("A")
    for name, operation, target, refusal in TABLES[table]:
        key = presented(name, own, "A")
        if refusal is None:
            acting = target or ("A" if name == "own" else None)
            assert policy.check(key, operation, target) == acting, (name, operation, target)
        else:
            with pytest.raises(GatewayError) as err:
                policy.check(key, operation, target)
            assert type(err.value) is refusal, (name, operation, target, err.value)


def test_refusals_say_why():
    policy = KeyPolicy(KeyRing([GLOBAL_KEY], secret="s3cret"))
    own = policy.keys.issue("A")
    cases = [(None, CHAT, None, "missing API key", "missing_api_key"),
             ("", CHAT, None, "missing API key", "missing_api_key"),
             ("wrong", CHAT, None, "invalid API key", "invalid_api_key"),
             (own, GENERATE, "B", "this API key belongs to another session", None),
             (own, STATS, None, "a per-session API key cannot do this", None)]
    for key, operation, target, message, code in cases:
        with pytest.raises(GatewayError) as err:
            policy.check(key, operation, target)
        assert (err.value.message, err.value.code) == (message, code)
    assert (Unauthorized.status, Unauthorized.grpc_code) == (401, grpc.StatusCode.UNAUTHENTICATED)
    assert (Forbidden.status, Forbidden.grpc_code) == (403, grpc.StatusCode.PERMISSION_DENIED)
    assert (GlobalKeyRequired.status, GlobalKeyRequired.grpc_code) == (403, grpc.StatusCode.UNAUTHENTICATED)


def test_every_operation_but_session_start_stats_metrics_and_reflection_is_open_to_a_session_key():
    policy = KeyPolicy(KeyRing([GLOBAL_KEY]))
    own = policy.keys.issue("A")
    global_only = {Operation.START_SESSION, Operation.STATS, Operation.METRICS, Operation.REFLECTION}
    for operation in Operation:
        if operation in global_only:
            with pytest.raises(GlobalKeyRequired):
                policy.check(own, operation)
        else:
            assert policy.check(own, operation) == "A"
        assert policy.check(GLOBAL_KEY, operation, "B") == "B"


# ------------------------------------------------------------------------------------- both front ends


@pytest.fixture(scope="module")
def gateways(tiny_actor, tmp_path_factory):
    procs = {}
    try:
        key_file = tmp_path_factory.mktemp("gateway-auth-key") / "gateway.key"
        key_file.write_text(f"# the gateway's global key\n\n{GLOBAL_KEY}\n")          # never on a command line
        for table, extra in (("with keys", ("--api-key-file", str(key_file))), ("without keys", ())):
            directory = tmp_path_factory.mktemp("gateway-auth")
            procs[table] = start_gateway(directory, [tiny_actor.address], directory / "pool", *extra)
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def http_outcome(http: httpx.Client, key: str | None, operation: Operation, session_id: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if operation is CHAT:
        path = f"/s/{session_id}/v1/chat/completions" if session_id else "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        return http.post(path, headers=headers, json=body).status_code
    if operation is ADD_REWARD:
        body = {"call_index": 0, "reward": 1.0}
        return http.post(f"/v1/sessions/{session_id}/rewards", headers=headers, json=body).status_code
    if operation is END_SESSION:
        return http.post(f"/v1/sessions/{session_id}/end", headers=headers, json={}).status_code
    if operation is START_SESSION:
        return http.post("/v1/sessions", headers=headers, json={}).status_code
    return http.get("/v1/stats", headers=headers).status_code


def grpc_outcome(stub: gateway_pb2_grpc.GatewayStub, key: str | None, operation: Operation,
                 session_id: str | None) -> grpc.StatusCode:
    metadata, target = bearer_metadata(key), session_id or ""
    try:
        if operation is CHAT:
            request = gateway_pb2.ChatRequest(session_id=target, messages=[gateway_pb2.ChatMessage(
                role="user", content="hi")], sampling=common_pb2.SamplingParams(max_tokens=1))
            list(stub.Chat(request, metadata=metadata, timeout=60))
        elif operation is ADD_REWARD:
            stub.AddReward(gateway_pb2.AddRewardRequest(session_id=target, call_index=0, reward=1.0),
                           metadata=metadata, timeout=30)
        elif operation is END_SESSION:
            stub.EndSession(gateway_pb2.EndSessionRequest(session_id=target), metadata=metadata, timeout=30)
        elif operation is START_SESSION:
            stub.StartSession(gateway_pb2.StartSessionRequest(), metadata=metadata, timeout=30)
        else:
            stub.Stats(common_pb2.StatsRequest(), metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("front", ["http", "grpc"])
@pytest.mark.parametrize("table", sorted(TABLES))
def test_both_front_ends_answer_the_table_alike(gateways, table, front):
    gateway = gateways[table]
    run = uuid.uuid4().hex[:8]
    with httpx.Client(base_url=gateway.http, timeout=60) as http, \
            grpc.insecure_channel(gateway.grpc_address) as channel:
        global_headers = {"Authorization": f"Bearer {GLOBAL_KEY}"}
        sessions, own = {}, ""
        for name in ("A", "B", "C"):
            opened = http.post("/v1/sessions", headers=global_headers, json={"session_id": f"{front}-{name}-{run}"})
            assert opened.status_code == 200, opened.text
            sessions[name] = opened.json()["session"]["session_id"]
            own = own or opened.json()["api_key"]
        stub = gateway_pb2_grpc.GatewayStub(channel)
        got, expected = [], []
        for name, operation, target, refusal in TABLES[table]:
            key, session_id = presented(name, own, sessions["A"]), sessions.get(target)
            if front == "http":
                got.append(http_outcome(http, key, operation, session_id))
                expected.append(200 if refusal is None else refusal.status)
            else:
                got.append(grpc_outcome(stub, key, operation, session_id))
                expected.append(grpc.StatusCode.OK if refusal is None else refusal.grpc_code)
        rows = [(name, str(operation), target) for name, operation, target, _ in TABLES[table]]
        assert list(zip(rows, got, strict=True)) == list(zip(rows, expected, strict=True))
        calls = http.get(f"/v1/sessions/{sessions['A']}", headers=global_headers).json()["calls"]
        own_chats = sum(1 for name, operation, target, refusal in TABLES[table]
                        if operation is CHAT and refusal is None and (target == "A" or name == "own"))
        assert len(calls) == own_chats          # a per-session key without a target chats in its own session


@pytest.mark.parametrize("table", sorted(TABLES))
def test_prometheus_metrics_follow_the_key_policy_of_stats(gateways, table):
    gateway = gateways[table]
    with httpx.Client(base_url=gateway.http, timeout=60) as http:
        opened = http.post("/v1/sessions", headers={"Authorization": f"Bearer {GLOBAL_KEY}"}, json={})
        own = opened.json()["api_key"]
        outcomes = {name: http.get("/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
                    for name, key in (("none", None), ("wrong", "wrong-key"), ("own", own), ("global", GLOBAL_KEY))}
    if table == "with keys":
        expected = {"none": 401, "wrong": 401, "own": 403, "global": 200}
        assert outcomes["none"].json()["error"]["code"] == "missing_api_key"
    else:
        expected = {"none": 200, "wrong": 200, "own": 200, "global": 200}     # as STATS: no keys, no refusal
    assert {name: r.status_code for name, r in outcomes.items()} == expected
    assert "forge_gateway_sessions_open{" in outcomes["global"].text
    assert outcomes["global"].headers["content-type"].startswith("text/plain")


def test_keys_that_are_not_ascii_are_refused_as_invalid():
    policy = KeyPolicy(KeyRing([GLOBAL_KEY], secret="s3cret"))
    own = policy.keys.issue("A")
    for key in ("caf\u00e9", "caf\udce9", "\ud800", own[:-1] + "\u00e9", own[:-1] + "\udce9", "fsk_\u00e9.x"):
        with pytest.raises(Unauthorized, match="invalid API key"):
            policy.check(key, CHAT, "A")
    assert KeyPolicy(KeyRing()).check("caf\udce9", CHAT, "A") == "A"      # without keys: no key is needed


@pytest.mark.parametrize("table", sorted(TABLES))
def test_a_header_key_that_is_not_ascii_is_a_401_or_ignored_never_a_500(gateways, table):
    gateway = gateways[table]
    own = httpx.post(f"{gateway.http}/v1/sessions", headers={"Authorization": f"Bearer {GLOBAL_KEY}"},
                     json={}).json()["api_key"]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    expected = 401 if table == "with keys" else 200
    with httpx.Client(base_url=gateway.http, timeout=60) as http:
        for raw in (b"caf\xc3\xa9", b"caf\xe9", b"\xff\xfe", own[:-1].encode() + b"\xe9",
                    own[:-1].encode() + b"\xc3\xa9"):
            for headers in ({"Authorization": b"Bearer " + raw}, {"X-Api-Key": raw}):
                response = http.post("/v1/chat/completions", headers=headers, json=body)
                assert response.status_code == expected, (raw, response.text)
                if expected == 401:
                    assert response.json()["error"]["code"] == "invalid_api_key"
    assert "Traceback" not in gateway.log()
