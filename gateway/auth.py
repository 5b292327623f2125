"""Who may call what: the one rule on API keys that both front ends apply.

With keys configured (``--api-key``), a call needs a global key or a per-session key (``keys.py``). A global key may
do anything. A per-session key acts on its own session only (an empty target means that session) and only through
the operations of a session; starting sessions, stats, Prometheus metrics and reflection need a global key. Without keys nothing needs a
key, but a per-session key still names its session and acts on no other. Refusals are the gateway's errors, which
each front end answers with its own status.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from forge.gateway.errors import Forbidden, GlobalKeyRequired, Unauthorized
from forge.gateway.keys import KeyRing


class Operation(StrEnum):
    START_SESSION = "start_session"
    STATS = "stats"
    METRICS = "metrics"
    REFLECTION = "reflection"
    MODELS = "models"
    TOKENIZE = "tokenize"
    CHAT = "chat"
    GENERATE = "generate"
    GET_SESSION = "get_session"
    END_SESSION = "end_session"
    ADD_REWARD = "add_reward"


SESSION_OPERATIONS = frozenset({Operation.MODELS, Operation.TOKENIZE, Operation.CHAT, Operation.GENERATE,
                                Operation.GET_SESSION, Operation.END_SESSION, Operation.ADD_REWARD})


@dataclass(frozen=True)
class Caller:
    privileged: bool                # a global key, or no keys configured: any operation
    session_id: str | None          # the session a per-session key names


class KeyPolicy:
    def __init__(self, keys: KeyRing) -> None:
        self.keys = keys

    def authenticate(self, key: str | None) -> Caller:
        """Who presents ``key``; Unauthorized when keys are configured and it is neither kind."""
        owner = self.keys.session_of(key)
        if not self.keys.required:
            return Caller(True, owner)
        if self.keys.is_global(key):
            return Caller(True, None)
        if owner is not None:
            return Caller(False, owner)
        if not key:
            raise Unauthorized("missing API key", code="missing_api_key")
        raise Unauthorized("invalid API key", code="invalid_api_key")

    def authorize(self, caller: Caller, operation: Operation, session_id: str | None = None) -> str | None:
        """The session a call of ``operation`` on ``session_id`` acts on: that one, else the caller's own (None when
        neither names one); Forbidden when the caller may not."""
        if not caller.privileged and operation not in SESSION_OPERATIONS:
            raise GlobalKeyRequired("a per-session API key cannot do this")
        if caller.session_id is not None and session_id and session_id != caller.session_id:
            raise Forbidden("this API key belongs to another session")
        return session_id or caller.session_id

    def check(self, key: str | None, operation: Operation, session_id: str | None = None) -> str | None:
        """``authorize`` for the caller presenting ``key``."""
        return self.authorize(self.authenticate(key), operation, session_id)
