"""Who owns what, while the server runs: the clients' sessions (kept alive by heartbeats, ended by ``finish`` or by
silence), the models they train (addressed by the id the client was given, owned by the key that created them), and
their sampling sessions. A key is never stored: only its digest (``owner_of``), which is also what ``Training``
records as a model's owner, so that ownership of saved models survives a restart.

Every lookup takes the asking key's digest, and something another key owns is answered exactly as something absent.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from forge.learner.tinker.errors import ApiError, not_found
from forge.learner.tinker.futures import CompletionQueue
from forge.learner.tinker.ordering import OrderedRunner
from forge.learner.tinker.types import ModelInfo

MAX_SESSIONS_PER_OWNER = 1024


def owner_of(api_key: str) -> str:
    """The digest a key is known by (never the key)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


@dataclass
class Session:
    session_id: str
    owner: str
    tags: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    finished: str | None = None                 # the reason the client gave, or "expired"
    model_ids: set[str] = field(default_factory=set)
    sampler_ids: set[str] = field(default_factory=set)


@dataclass
class ModelEntry:
    """A model being trained: ``model_id`` is what the client calls it, ``info.model_id`` what ``Training`` does
    (the same, except for a model the SDK created by loading a checkpoint, whose id the SDK makes itself)."""

    model_id: str
    owner: str
    session_id: str
    info: ModelInfo
    runner: OrderedRunner
    last_request: float = field(default_factory=time.time)

    @property
    def training_id(self) -> str:
        return self.info.model_id


@dataclass
class SamplerEntry:
    sampler_id: str
    owner: str
    session_id: str
    base_model: str
    model_path: str | None
    completions: CompletionQueue = field(default_factory=CompletionQueue)


class Registry:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, ModelEntry] = {}
        self.samplers: dict[str, SamplerEntry] = {}
        self.creations: dict[tuple[str, int], str] = {}     # (session, model_seq_id) → create request id

    def new_session(self, owner: str, tags: tuple[str, ...]) -> Session:
        live = sum(1 for s in self.sessions.values() if s.owner == owner and s.finished is None)
        if live >= MAX_SESSIONS_PER_OWNER:
            raise ApiError(429, f"this key has {live} open sessions; finish some first")
        session = Session(f"sess-{uuid.uuid4().hex[:20]}", owner, tags)
        self.sessions[session.session_id] = session
        return session

    def session(self, session_id: Any, owner: str, *, open_only: bool = True) -> Session:
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None or session.owner != owner:
            raise not_found(f"session {session_id!r}")
        if open_only and session.finished is not None:
            raise ApiError(410, f"session {session_id} has ended ({session.finished})")
        return session

    def heartbeat(self, session_id: Any, owner: str) -> None:
        self.session(session_id, owner).last_seen = time.monotonic()

    def model(self, model_id: Any, owner: str) -> ModelEntry:
        entry = self.models.get(model_id) if isinstance(model_id, str) else None
        if entry is None or entry.owner != owner:
            raise not_found(f"model {model_id!r}")
        return entry

    def add_model(self, entry: ModelEntry) -> None:
        self.models[entry.model_id] = entry
        session = self.sessions.get(entry.session_id)
        if session is not None:
            session.model_ids.add(entry.model_id)

    def drop_model(self, model_id: str) -> ModelEntry | None:
        entry = self.models.pop(model_id, None)
        if entry is not None and entry.session_id in self.sessions:
            self.sessions[entry.session_id].model_ids.discard(model_id)
        return entry

    def wire_id(self, training_id: str) -> str:
        """The id a client calls the model ``Training`` calls ``training_id`` (itself when loaded by no alias)."""
        for entry in self.models.values():
            if entry.training_id == training_id:
                return entry.model_id
        return training_id

    def training_id(self, model_id: str) -> str:
        entry = self.models.get(model_id)
        return entry.training_id if entry is not None else model_id

    def add_sampler(self, session: Session, base_model: str, model_path: str | None, seq: int | None) -> SamplerEntry:
        suffix = str(seq) if seq is not None else uuid.uuid4().hex[:12]
        sampler = SamplerEntry(f"{session.session_id}:sample:{suffix}", session.owner, session.session_id,
                               base_model, model_path)
        self.samplers[sampler.sampler_id] = sampler
        session.sampler_ids.add(sampler.sampler_id)
        return sampler

    def sampler(self, sampler_id: Any, owner: str) -> SamplerEntry:
        sampler = self.samplers.get(sampler_id) if isinstance(sampler_id, str) else None
        if sampler is None or sampler.owner != owner:
            raise not_found(f"sampling session {sampler_id!r}")
        return sampler

    def expired(self, timeout_s: float) -> list[Session]:
        """Open sessions silent for longer than ``timeout_s``, now marked ended."""
        now = time.monotonic()
        found = [s for s in self.sessions.values() if s.finished is None and now - s.last_seen > timeout_s]
        for session in found:
            session.finished = "expired"
        return found

    def forget_ended(self, keep: int = 10_000) -> None:
        """Drop the oldest ended sessions beyond ``keep`` (with their samplers)."""
        ended = sorted((s for s in self.sessions.values() if s.finished is not None and not s.model_ids),
                       key=lambda s: s.created)
        for session in ended[:max(0, len(ended) - keep)]:
            del self.sessions[session.session_id]
            for sampler_id in session.sampler_ids:
                self.samplers.pop(sampler_id, None)
