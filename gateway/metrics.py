"""The gateway's figures for its Stats RPC: counters, calls per second over the last 10 s, and latency
percentiles (whole call and time to first token) over the most recent calls."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

import numpy as np

RATE_WINDOW_S = 10.0
COUNTERS = ("calls", "errors", "client_errors", "call_failures", "tito_splices", "tito_partial", "tito_fallbacks",
            "tito_fresh", "client_disconnects", "sessions_started", "sessions_ended", "sessions_expired",
            "http_requests", "grpc_requests")


class LatencyWindow:
    def __init__(self, size: int = 2048) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self.values.append(seconds)

    def percentiles_ms(self) -> tuple[float, float]:
        if not self.values:
            return 0.0, 0.0
        p50, p99 = np.percentile(np.fromiter(self.values, dtype=np.float64), [50, 99])
        return float(p50) * 1e3, float(p99) * 1e3


class Metrics:
    """Counters may be bumped from any thread (gRPC handlers); the rest lives on the event loop."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.latency = LatencyWindow()
        self.ttft = LatencyWindow()
        self._done: deque[float] = deque()
        self.started = time.time()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def call_done(self, total_s: float, ttft_s: float | None) -> None:
        now = time.monotonic()
        self._done.append(now)
        self.count("calls")
        self.latency.add(total_s)
        if ttft_s is not None:
            self.ttft.add(ttft_s)

    def calls_per_s(self) -> float:
        now = time.monotonic()
        while self._done and now - self._done[0] > RATE_WINDOW_S:
            self._done.popleft()
        span = min(RATE_WINDOW_S, max(1e-3, time.time() - self.started))
        return len(self._done) / span

    def gauges(self) -> dict[str, float]:
        p50, p99 = self.latency.percentiles_ms()
        t50, t99 = self.ttft.percentiles_ms()
        figures = {"calls_per_s": self.calls_per_s(), "latency_ms_p50": p50, "latency_ms_p99": p99,
                   "ttft_ms_p50": t50, "ttft_ms_p99": t99}
        with self._lock:
            counters = dict(self.counters)
        for name in COUNTERS:
            figures[name] = float(counters.get(name, 0))
        for name, value in counters.items():
            figures.setdefault(name, float(value))
        return figures
