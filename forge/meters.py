"""Online estimates: an exponentially weighted moving average, and an event rate over a sliding window."""

from __future__ import annotations

import threading
import time
from collections import deque


class Ewma:
    """EWMA of a measured quantity, with a prior used until the first sample."""

    def __init__(self, prior: float, alpha: float = 0.2) -> None:
        self.value = prior
        self.alpha = alpha
        self.samples = 0

    def update(self, sample: float) -> float:
        self.value = sample if self.samples == 0 else self.value + self.alpha * (sample - self.value)
        self.samples += 1
        return self.value


class RateMeter:
    """Events per second over the last ``window_s`` seconds (thread-safe)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.total = 0
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def add(self, count: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            self.total += count
            self._events.append((now, count))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self.window_s:
            self._events.popleft()

    def per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            span = min(self.window_s, max(now - self._started, 1e-3))
            return sum(n for _, n in self._events) / span
