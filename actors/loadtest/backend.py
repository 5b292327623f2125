"""The load-test backend: a stand-in for a model that answers every request at a set pace and computes nothing, so
the middleware in front of the actors (gateway, pool, router) can be measured alone, at loads no CPU could generate
with a model. ``bench/gateway_load.py`` runs it behind the real actor server; training runs refuse it.

A request's first token comes ``first_token_ms`` after it arrives plus its prompt at ``prefill_tokens_per_s``; the
rest at ``tokens_per_s``, every request on its own clock, in messages of its stream interval. The ids are drawn, by
the request's seed, from the vocabulary's plain word pieces (``plain_ids``), so the text decodes as words and holds
no special token; each carries a log-prob from the same draw and the weight version last loaded (weights are taken
and dropped: nothing runs them). A request ends at its max tokens, or at a stop id drawn after its min tokens.

One pacing thread keeps the requests in a heap by the time their next message is due: a message costs a heap
operation and a queue put, whatever the number of requests in flight."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from forge.actors.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    Ledger,
    RequestStream,
    TokenChunk,
    batched_wakeups,
)
from forge.actors.kinds import LOADTEST
from forge.actors.limits import InvalidRequest, RequestLimits
from forge.actors.loadtest.config import LoadTestConfig
from forge.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PLAIN_PIECE = re.compile(r" ?[A-Za-z]{2,12}")
MAX_LOGPROB_DRAW = 4.0          # log-probs are drawn uniformly from (-MAX_LOGPROB_DRAW, 0]


def plain_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids of the vocabulary's plain word pieces (letters, with or without a leading space): what the backend
    answers with. ValueError when the vocabulary has none."""
    special = set(tokenizer.backend.get_added_tokens_decoder())
    texts = tokenizer.backend.decode_batch([[i] for i in range(tokenizer.vocab_size)])
    found = [i for i, text in enumerate(texts) if i not in special and PLAIN_PIECE.fullmatch(text)]
    if not found:
        raise ValueError("the tokenizer has no plain word pieces for the load-test backend to answer with")
    return found


@dataclass(eq=False)
class _Live:
    """One request in flight: its stream, its draws and how far it has come."""

    request_id: str
    stream: RequestStream
    rng: random.Random
    max_tokens: int
    min_tokens: int
    stops: frozenset[int]
    interval: int                   # tokens a message after the first
    top_logprobs: int
    arrived: float
    sent: int = 0
    first_at: float = 0.0
    due: float = field(default=0.0)


class LoadTestBackend(Backend):
    """Tokens at a set pace from no model (see the module's docstring)."""

    kind = LOADTEST

    def __init__(self, plain: Sequence[int], limits: RequestLimits, pace: LoadTestConfig, stream_interval: int = 0,
                 seed: int = 0, version: int = 0) -> None:
        self._plain = list(plain)
        self.limits = limits
        self._pace = pace
        self._stream_interval = stream_interval
        self._seed = seed
        self._lock = threading.Lock()
        self._pending = threading.Condition(self._lock)
        self._due: list[tuple[float, int, _Live]] = []
        self._order = itertools.count()
        self.ledger = Ledger(version, limits.max_in_flight)
        self._counters = {"tokens": 0, "finished": 0, "aborted": 0, "weight_swaps": 0}
        self._started = time.monotonic()
        self._closed = False
        self._thread = threading.Thread(target=self._pace_requests, name="loadtest-pacer", daemon=True)
        self._thread.start()

    @property
    def weight_version(self) -> int:
        return self.ledger.accepted_version

    def submit(self, request: GenerationRequest) -> RequestStream:
        max_tokens, stops = self.limits.check(request)
        if request.score_from:
            raise InvalidRequest("the load-test backend scores nothing: it has no model")
        if request.prefill_only or request.continuation is not None:
            raise InvalidRequest("the load-test backend does not serve disaggregated requests (prefill_only, "
                                 "continuations)")
        params = request.params
        if params.grammar is not None:
            raise InvalidRequest("the load-test backend samples no grammar (structured output): it has no model")
        self.ledger.check_adapter_named(request)
        request_id = request.request_id or uuid.uuid4().hex
        seed = params.seed if params.seed is not None else self._request_seed(request_id)
        interval = request.stream_interval or self._stream_interval or 1
        arrived = time.monotonic()
        live = _Live(request_id, RequestStream(request_id), random.Random(seed), max_tokens, params.min_tokens,
                     stops, interval, params.top_logprobs, arrived)
        prefill = len(request.prompt_ids) / self._pace.loadtest_prefill_tokens_per_s \
            if self._pace.loadtest_prefill_tokens_per_s else 0.0
        live.due = arrived + self._pace.loadtest_first_token_ms / 1e3 + prefill
        with self._lock:
            self.ledger.admit(request_id, live, "the actor is shutting down" if self._closed else "")
            heapq.heappush(self._due, (live.due, next(self._order), live))
            self._pending.notify()
        return live.stream

    def _request_seed(self, request_id: str) -> int:
        digest = hashlib.blake2b(f"{self._seed}:{request_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def _pace_requests(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._pending.wait(self._due[0][0] - time.monotonic() if self._due else None)
                if self._closed:
                    return
                now = time.monotonic()
                with batched_wakeups():
                    while self._due and self._due[0][0] <= now:
                        _, _, live = heapq.heappop(self._due)
                        if self.ledger.live.get(live.request_id) is live and self._send(live, now):
                            heapq.heappush(self._due, (live.due, next(self._order), live))

    def _send(self, live: _Live, now: float) -> bool:
        """Put the request's next message (under the lock); whether more are to come (its ``due`` then set)."""
        count = 1 if live.sent == 0 else min(live.interval, live.max_tokens - live.sent)
        ids, logprobs, finish = [], [], None
        for _ in range(count):
            token = live.rng.choice(self._plain)
            ids.append(token)
            logprobs.append(-live.rng.random() * MAX_LOGPROB_DRAW)
            if token in live.stops and live.sent + len(ids) > live.min_tokens:
                finish = FinishReason.STOP
                break
        live.sent += len(ids)
        if finish is None and live.sent >= live.max_tokens:
            finish = FinishReason.LENGTH
        chunk = TokenChunk(ids, logprobs, [self.ledger.accepted_version] * len(ids),
                           [self._top(token, lp, live) for token, lp in zip(ids, logprobs, strict=True)]
                           if live.top_logprobs else [], finish)
        if live.first_at == 0.0:
            live.first_at = now
        self._counters["tokens"] += len(ids)
        if finish is not None:
            del self.ledger.live[live.request_id]
            self._counters["finished"] += 1
            chunk.prefill_s, chunk.decode_s = live.first_at - live.arrived, now - live.first_at
            chunk.total_s = now - live.arrived
        live.stream.put(chunk)
        if finish is not None:
            return False
        rate = self._pace.loadtest_tokens_per_s
        live.due = now + (min(live.interval, live.max_tokens - live.sent) / rate if rate else 0.0)
        return True

    def _top(self, token: int, logprob: float, live: _Live) -> tuple[list[int], list[float]]:
        """The N most likely tokens of a drawn distribution: the drawn one first, the others less likely."""
        others = [t for t in live.rng.sample(self._plain, min(live.top_logprobs, len(self._plain))) if t != token]
        return [token, *others[:live.top_logprobs - 1]], \
            [logprob, *(logprob - 0.5 * (k + 1) for k in range(len(others[:live.top_logprobs - 1])))]

    def abort(self, request_id: str) -> bool:
        with self._lock:
            live = self.ledger.live.pop(request_id, None)
            if live is None:
                return False
            self._counters["aborted"] += 1
            live.stream.put(TokenChunk(finish_reason=FinishReason.ABORT))
        return True

    def load_weights(self, version: int, state_dict: Mapping[str, object]) -> None:
        """Take ``version`` as the one its tokens carry from now on; the tensors are dropped (nothing runs them)."""
        with self._lock:
            self.ledger.accept_version(version)
            self._counters["weight_swaps"] += 1
        log.info("weight version %d taken (%d tensors, dropped: the load-test backend has no model)", version,
                 len(state_dict))

    def stats(self) -> dict[str, float]:
        with self._lock:
            running = len(self.ledger.live)
            counters = dict(self._counters)
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return {"running": float(running), "waiting": 0.0, "kv_used_frac": 0.0, "refused": float(self.ledger.refused),
                "weight_version": float(self.ledger.accepted_version), "tokens_per_s": counters["tokens"] / elapsed,
                **{name: float(value) for name, value in counters.items()}}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pending.notify()
        self._thread.join()
        for request_id in list(self.ledger.live):
            self.abort(request_id)
