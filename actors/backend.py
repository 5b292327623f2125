"""The one interface every inference backend implements (embedded torch engine, TensorRT-LLM, vLLM).

A backend takes token ids and sampling parameters and streams back sampled token ids, each with its behaviour
log-probability and the weight version that produced it; it can abort a request, load a new weight version, and
report its figures. The gRPC actor server is written against this interface only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from forge.actors.kinds import BackendKind
from forge.actors.limits import InvalidRequest
from forge.model.lora_weights import is_adapter_version, merge_adapter_version
from forge.sampling.params import SamplingParams

if TYPE_CHECKING:
    import torch

    from forge.actors.config import ActorConfig

log = logging.getLogger(__name__)


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class Overloaded(RuntimeError):
    """The backend's queue is full; retry later or elsewhere."""


@dataclass
class Continuation:
    """The first tokens of a request, sampled by another actor (disaggregated serving): the backend continues after
    them as if it had sampled them itself. One weight version produced them all."""

    token_ids: list[int]
    logprobs: list[float]
    weight_version: int


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    session_id: str = ""
    stream_interval: int = 0        # tokens per chunk after the first, 0 = the backend's (TensorRT-LLM: its own)
    prefill_only: bool = False      # sample the first token only, and store the prompt's KV blocks in the L3 cache
    continuation: Continuation | None = None
    adapter: str = ""               # the named LoRA adapter to sample with (several runs on one actor); "" = none
    score_from: int = 0             # > 0: sample nothing, score the prompt's tokens from this position on


TopTokens = tuple[list[int], list[float]]      # the most likely token ids of one distribution and their log-probs


@dataclass(frozen=True)
class RoutedExperts:
    """The experts each sparse layer chose at every position a request fed through the model (a model with
    experts): ``ids`` int32 [positions, sparse layers, top_k], -1 where this backend did not compute the position."""

    ids: np.ndarray
    num_experts: int


@dataclass
class TokenChunk:
    """Tokens sampled for one request in one engine step (or the final, possibly empty, chunk)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    top_logprobs: list[TopTokens] = field(default_factory=list)    # per token when the request asks for them
    finish_reason: FinishReason | None = None
    error: str = ""
    cached_prompt_tokens: int = 0
    handover_blocks: int = 0        # final chunk of a prefill_only request: the prompt's blocks stored in L3
    retryable: bool = False         # with ERROR: nothing was sampled, the request may be sent again (elsewhere)
    continues: bool = False         # final chunk of a prefill_only request: there is room for more tokens
    routed_experts: RoutedExperts | None = None     # final chunk, a model with experts: its routing
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0


class RequestStream:
    """The consumer side of one request: iterate (``for`` or ``async for``) to receive chunks until the finishing
    one. The producer is the backend's thread."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._chunks: queue.SimpleQueue[TokenChunk] = queue.SimpleQueue()
        self._drained = False
        self._wake: Callable[[], None] | None = None      # set while an asyncio consumer waits
        self.finished = threading.Event()

    def put(self, chunk: TokenChunk) -> None:
        self._chunks.put(chunk)
        if chunk.finish_reason is not None:
            self.finished.set()
        wake = self._wake
        if wake is not None:
            wake()

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

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        """Chunks until the finishing one, awaited on the running event loop without a thread per stream."""
        ready = asyncio.Event()
        self._wake = functools.partial(_LoopWaker.of(asyncio.get_running_loop()).wake, ready)
        try:
            while not self._drained:
                try:
                    chunk = self._chunks.get_nowait()
                except queue.Empty:
                    ready.clear()
                    if self._chunks.empty():     # a put after this schedules ready.set(): no wake-up is lost
                        await ready.wait()
                    continue
                self._drained = chunk.finish_reason is not None
                yield chunk
        finally:
            self._wake = None


_held = threading.local()


@contextlib.contextmanager
def batched_wakeups() -> Iterator[None]:
    """Chunks this thread puts inside the block wake their asyncio consumers together at its end: one engine step's
    chunks for many streams cost one wake-up of the server's loop, not a handoff of the interpreter lock per
    stream."""
    if getattr(_held, "wakers", None) is not None:       # nested: the outer block flushes
        yield
        return
    _held.wakers = held = set()
    try:
        yield
    finally:
        _held.wakers = None
        for waker in held:
            waker.flush()


class _LoopWaker:
    """Sets asyncio events of one loop from other threads; wakes coalesce while a callback is pending or while the
    putting thread is inside ``batched_wakeups``."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]] = \
        weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[asyncio.Event] = []
        self._scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopWaker:
        """The loop's waker (call on the loop's thread)."""
        waker = cls._by_loop.get(loop)
        if waker is None:
            waker = cls._by_loop[loop] = cls(loop)
        return waker

    def wake(self, event: asyncio.Event) -> None:
        held = getattr(_held, "wakers", None)
        with self._lock:
            self._pending.append(event)
            if self._scheduled:
                return
            if held is not None:
                held.add(self)
                return
            self._scheduled = True
        self._schedule()

    def flush(self) -> None:
        with self._lock:
            if self._scheduled or not self._pending:
                return
            self._scheduled = True
        self._schedule()

    def _schedule(self) -> None:
        with contextlib.suppress(RuntimeError):      # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._set_pending)

    def _set_pending(self) -> None:
        with self._lock:
            pending, self._pending, self._scheduled = self._pending, [], False
        for event in pending:
            event.set()


def check_weights(version: int, state_dict: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless ``state_dict`` holds exactly the model's tensors (``shapes``), each of its shape."""
    if is_adapter_version(state_dict):
        raise ValueError(f"weight version {version} holds LoRA adapters only, which this backend does not merge: "
                         f"publish merged weights ([learner] lora_publish = \"merged\")")
    problems = [n for n in shapes if n not in state_dict or tuple(state_dict[n].shape) != tuple(shapes[n])]
    if problems or len(state_dict) != len(shapes):
        extra = sorted(set(state_dict) - set(shapes))
        raise ValueError(f"weight version {version} does not fit the model: mismatched {problems[:5]}, "
                         f"unexpected {extra[:5]}")


class Ledger:
    """What every backend keeps alike, whatever runs its model: the newest weight version it accepted, the newest
    accepted version of each named adapter, the requests in flight (at most ``max_in_flight``, each with the
    backend's own entry), and the base weights LoRA adapter versions merge onto once they come as weight versions.
    It locks nothing: each backend calls it under its own lock, which also guards what it stages with it."""

    def __init__(self, version: int, max_in_flight: int) -> None:
        self.accepted_version = version
        self.max_in_flight = max_in_flight
        self.adapters: dict[str, int] = {}          # named adapter -> its newest accepted version
        self.live: dict[str, Any] = {}              # request id -> the backend's entry for it
        self.refused = 0                            # requests refused for want of room
        self._base: dict[str, torch.Tensor] | None = None
        self._took_full_weights = False

    def check_version(self, version: int) -> None:
        """ValueError unless ``version`` is newer than the newest accepted."""
        if version <= self.accepted_version:
            raise ValueError(f"weight version {version} is not newer than {self.accepted_version}")

    def accept_version(self, version: int) -> None:
        """Take ``version`` as the newest (compared with the newest accepted, not the applied one: a newer version
        may be on its way in); ValueError when it is not newer."""
        self.check_version(version)
        self.accepted_version = version

    def check_adapter_version(self, name: str, version: int) -> None:
        """ValueError unless ``version`` of the named adapter is newer than its newest accepted one."""
        accepted = self.adapters.get(name, -1)
        if version <= accepted:
            raise ValueError(f"version {version} of adapter {name!r} is not newer than {accepted}")

    def accept_adapter(self, name: str, version: int) -> None:
        self.check_adapter_version(name, version)
        self.adapters[name] = version

    def drop_adapter(self, name: str) -> None:
        """Forget the named adapter (it is no longer served: requests naming it are refused, and any version of it
        may come again); ValueError when none of that name is held."""
        if self.adapters.pop(name, None) is None:
            raise ValueError(f"no adapter named {name!r} is served here")

    def check_adapter_named(self, request: GenerationRequest, also: Iterable[str] = ()) -> None:
        """Raise InvalidRequest when ``request`` names an adapter neither accepted here nor among ``also``."""
        served = self.adapters.keys() | set(also)
        if request.adapter and request.adapter not in served:
            raise InvalidRequest(f"no adapter named {request.adapter!r} is served here (serving: "
                                 f"{', '.join(sorted(served)) or 'none'})")

    def admit(self, request_id: str, entry: Any, refusal: str = "") -> None:
        """Enter a request in flight. Overloaded with ``refusal`` (why the backend takes none now: it is shutting
        down, say) or when ``max_in_flight`` are in flight; InvalidRequest when its id is in flight already."""
        if refusal:
            raise Overloaded(refusal)
        if len(self.live) >= self.max_in_flight:
            self.refused += 1
            raise Overloaded(f"{len(self.live)} requests in flight; the queue is full, retry later")
        if request_id in self.live:
            raise InvalidRequest(f"request id {request_id!r} is already in flight")
        self.live[request_id] = entry

    def whole_weights(self, state_dict: Mapping[str, torch.Tensor], read_base: Callable[[], dict[str, torch.Tensor]],
                      base_is: str, served: Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
                      | None = None) -> Mapping[str, torch.Tensor]:
        """The whole model's weights of a weight version: ``state_dict`` itself, or, for a LoRA adapter version
        (``forge.model.lora_weights``), its adapters merged onto the base weights, which ``read_base`` gives (the
        backend's starting weights, ``base_is`` in the log) at the first adapter version; they are kept from then
        on. ``served`` keeps of an adapter version what the base holds. ValueError for an adapter version after a
        whole-model one: the base it adapts is gone."""
        if not is_adapter_version(state_dict):
            self._took_full_weights = True
            return state_dict
        if self._base is None:
            if self._took_full_weights:
                raise ValueError("a LoRA adapter version came after whole-model versions: the base it adapts is gone "
                                 "(restart the actor from the learner's base model)")
            self._base = read_base()
            log.info("weight versions are LoRA adapters: merging each onto %s (a host copy, %.0f MiB)", base_is,
                     sum(t.numel() * t.element_size() for t in self._base.values()) / 2**20)
        return merge_adapter_version(self._base, served(state_dict) if served is not None else state_dict)


class Backend(ABC):
    """An inference backend. Implementations are thread-safe: any thread may submit, abort or load weights."""

    kind: ClassVar[BackendKind]            # what this backend does (``forge.actors.kinds``): its one source

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def hands_over(self) -> bool:
        """Serves prefill_only requests and continuations (disaggregated serving)."""
        return self.kind.hands_over

    @property
    def scores(self) -> bool:
        """Serves scoring requests (GenerationRequest.score_from)."""
        return self.kind.scores

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
    def adapter_versions(self) -> dict[str, int]:
        """The named LoRA adapters served beside the base weights (several runs on one actor) and the version of
        each; requests name one in ``GenerationRequest.adapter``."""
        return {}

    def load_adapter(self, name: str, version: int, adapter_version: Mapping[str, torch.Tensor]) -> None:
        """Stage version ``version`` of the named adapter ``name`` (an adapter version, ``forge.model.lora_weights``),
        to serve beside the base weights from the next step on; ValueError when refused."""
        raise ValueError(f"the {self.name} backend serves no named adapters (several runs on one actor need the torch "
                         "engine)")

    def unload_adapter(self, name: str) -> None:
        """Stop serving the named adapter ``name`` (an adapter source dropped it): requests naming it are refused from
        now on, and those in flight end with an error; ValueError when it is not served."""
        raise ValueError(f"the {self.name} backend does not drop named adapters (an adapter source needs the torch "
                         "engine)")

    @property
    def failed(self) -> bool:
        """The backend can serve no more (its engine process died, say): a server should stop and be restarted."""
        return False

    @abstractmethod
    def close(self) -> None: ...


@dataclass(frozen=True)
class StartContext:
    """What the actor decided before building its backend."""

    device: str                                     # cpu, cuda or cuda:N (auto resolved)
    threads: int                                    # the backend's torch CPU threads (0: torch's default)
    initial_version: int                            # -1: serve only once the learner's first version is in
    curve: Any = None                               # the weight channel's CURVE keys (forge.weights.curve.ClientKeys)
    relay_curve: Any = None                         # the relay's (forge.weights.curve.ServerKeys)
    adapter_curves: dict[str, Any] = field(default_factory=dict)    # each --adapter stream's ClientKeys, by name
    source_curve: Any = None                        # the --adapter-source stream's ClientKeys
    relaying: bool = False                          # re-serve verified versions on the actor's relay endpoints
    on_exit: Callable[[str], None] | None = None    # called with the reason when the backend's own process dies


@dataclass
class Serving:
    """What a backend factory built: the backend, the id its model serves under, its KV events for the routers (the
    event log and a function describing its KV layout) where it keeps them, and whether it follows the learner's
    weights itself (then ``relay_endpoints`` are those it relays on)."""

    backend: Backend
    model_id: str
    kv_events: tuple[Any, Callable[[], Any]] | None = None
    follows_weights: bool = False
    relay_endpoints: dict[str, str] = field(default_factory=dict)


class BackendFactory(ABC):
    """How an actor builds one kind of backend. Each is registered under its name in ``forge.actors.factory``, the
    one place that picks."""

    name: ClassVar[str]

    def check(self, config: ActorConfig) -> None:  # noqa: B027 (most backends refuse nothing up front)
        """Refuse what this backend cannot serve, before anything loads: ValueError with the reason in one line."""

    def threads(self, config: ActorConfig) -> int:
        """Set this process's torch threads for the backend (before any torch work) and return its count."""
        if config.engine.threads:
            import torch

            torch.set_num_threads(config.engine.threads)
        return config.engine.threads

    @abstractmethod
    def build(self, config: ActorConfig, context: StartContext) -> Serving:
        """The backend, ready to serve; ValueError for a model it cannot serve, RuntimeError or TimeoutError where it
        cannot start."""
