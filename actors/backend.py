"""The one interface every inference backend implements (embedded torch engine, TensorRT-LLM, vLLM).

A backend takes token ids and sampling parameters and streams back sampled token ids, each with its behaviour
log-probability and the weight version that produced it; it can abort a request, load a new weight version, and
report its figures. The gRPC actor server is written against this interface only.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from forge.model.sampling import SamplingParams


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class InvalidRequest(ValueError):
    """The request cannot be served as given (empty prompt, unknown token ids, too long, bad sampling values)."""


class Overloaded(RuntimeError):
    """The backend's queue is full; retry later or elsewhere."""


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    session_id: str = ""
    stream_interval: int = 0        # tokens per chunk after the first, 0 = the backend's (TensorRT-LLM: its own)


@dataclass
class TokenChunk:
    """Tokens sampled for one request in one engine step (or the final, possibly empty, chunk)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str = ""
    cached_prompt_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0


class RequestStream:
    """The consumer side of one request: iterate to receive chunks until the finishing one."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._chunks: queue.SimpleQueue[TokenChunk] = queue.SimpleQueue()
        self._drained = False
        self.finished = threading.Event()

    def put(self, chunk: TokenChunk) -> None:
        self._chunks.put(chunk)
        if chunk.finish_reason is not None:
            self.finished.set()

    def get(self, timeout: float | None = None) -> TokenChunk:
        chunk = self._chunks.get(timeout=timeout)
        self._drained = chunk.finish_reason is not None
        return chunk

    def __iter__(self) -> Iterator[TokenChunk]:
        """Chunks until the finishing one; a stream already read to its end yields nothing more."""
        while not self._drained:
            chunk = self._chunks.get()
            self._drained = chunk.finish_reason is not None
            yield chunk


class Backend(ABC):
    """An inference backend. Implementations are thread-safe: any thread may submit, abort or load weights."""

    name: str = "backend"

    @abstractmethod
    def submit(self, request: GenerationRequest) -> RequestStream:
        """Validate and enqueue; raises InvalidRequest or Overloaded instead of enqueuing."""

    @abstractmethod
    def abort(self, request_id: str) -> bool:
        """Stop a request (its stream ends with ABORT); False when no such live request exists."""

    @abstractmethod
    def load_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Stage a complete, verified weight version; it takes effect at the next step boundary."""

    @property
    @abstractmethod
    def weight_version(self) -> int: ...

    @abstractmethod
    def stats(self) -> dict[str, float]:
        """Named figures for telemetry (tokens_per_s, running, waiting, kv_used_frac, …)."""

    @property
    def failed(self) -> bool:
        """The backend can serve no more (its engine process died, say): a server should stop and be restarted."""
        return False

    @abstractmethod
    def close(self) -> None: ...
