"""The gateway's key policy as one decision table, with keys configured and without, checked on the policy."""

from __future__ import annotations

import grpc
import pytest

from forge.gateway.auth import KeyPolicy, Operation
from forge.gateway.errors import Forbidden, GatewayError, GlobalKeyRequired, Unauthorized
from forge.gateway.keys import KeyRing

GLOBAL_KEY = "auth-global-key"
CHAT, GENERATE, ADD_REWARD, END_SESSION = Operation.CHAT, Operation.GENERATE, Operation.ADD_REWARD, Operation.END_SESSION
START_SESSION, STATS = Operation.START_SESSION, Operation.STATS

# (key, operation, target session, refusal). Keys: "global"; "own", the per-session key of session A; "forged", a
# key for A signed with another secret; "wrong"; None, no key. Targets are sessions A, B and C, or None (none named).
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


def test_every_operation_but_session_start_stats_and_reflection_is_open_to_a_session_key():
    policy = KeyPolicy(KeyRing([GLOBAL_KEY]))
    own = policy.keys.issue("A")
    global_only = {Operation.START_SESSION, Operation.STATS, Operation.REFLECTION}
    for operation in Operation:
        if operation in global_only:
            with pytest.raises(GlobalKeyRequired):
                policy.check(own, operation)
        else:
            assert policy.check(own, operation) == "A"
        assert policy.check(GLOBAL_KEY, operation, "B") == "B"
