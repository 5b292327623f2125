"""API keys: the global keys of the gateway, and per-session keys that a black-box agent sends as its OpenAI key.

A session key is ``fsk_<session id, base64url>.<HMAC-SHA256 of the id>``: it names its session and cannot be forged
without the gateway's secret, so it needs no table and survives restarts when the secret is kept
(``--session-key-secret``). Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable

from forge.rpc.auth import as_bytes, matches_any

PREFIX = "fsk_"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class KeyRing:
    def __init__(self, global_keys: Iterable[str] = (), secret: str | None = None) -> None:
        self.global_keys = tuple(k for k in global_keys if k)
        self._secret = (secret or secrets.token_hex(32)).encode()

    @property
    def required(self) -> bool:
        """Keys are configured: nothing but health is served without one."""
        return bool(self.global_keys)

    def is_global(self, key: str | None) -> bool:
        return bool(key) and matches_any(key, self.global_keys)

    def _mac(self, session_id: str) -> str:
        return _b64(hmac.new(self._secret, session_id.encode(), hashlib.sha256).digest()[:24])

    def issue(self, session_id: str) -> str:
        return f"{PREFIX}{_b64(session_id.encode())}.{self._mac(session_id)}"

    def session_of(self, key: str | None) -> str | None:
        """The session a valid session key belongs to; None for anything else."""
        if not key or not key.startswith(PREFIX) or "." not in key:
            return None
        encoded, mac = key[len(PREFIX):].rsplit(".", 1)
        try:
            session_id = _unb64(encoded).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return session_id if session_id and hmac.compare_digest(as_bytes(mac), self._mac(session_id).encode()) else None
