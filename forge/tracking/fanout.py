"""The trackers of one run, each in a thread of its own: a slow tracker (a tracking server that retries) never holds
up the caller, and a tracker that raises is dropped with one warning while the others, and the run, go on."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from forge.tracking.base import Tracker

log = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 60.0          # how long closing waits for a tracker to flush before leaving it behind


class _Lane:
    """One tracker opened and called in its own thread, in the order of the calls."""

    def __init__(self, name: str, opener: Callable[[], Tracker]) -> None:
        self.name = name
        self.failed = False
        self.calls: queue.Queue[Callable[[Tracker], Any] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, args=(opener,), name=f"tracker-{name}", daemon=True)
        self.thread.start()

    def _work(self, opener: Callable[[], Tracker]) -> None:
        tracker = None
        try:
            tracker = opener()
            while (call := self.calls.get()) is not None:
                call(tracker)
            tracker.close()
        except Exception as exc:            # any failure of a tracker's library: drop it, the run goes on
            self.failed = True
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("tracker %s failed and is dropped for the rest of the run: %s", self.name, reason)
            log.debug("tracker %s failed", self.name, exc_info=exc)
            if tracker is not None:
                try:
                    tracker.close()
                except Exception:
                    log.debug("tracker %s did not close", self.name, exc_info=True)

    def submit(self, call: Callable[[Tracker], Any]) -> None:
        if not self.failed and self.thread.is_alive():
            self.calls.put(call)

    def close(self, timeout_s: float) -> None:
        self.calls.put(None)
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            log.warning("tracker %s is still busy after %.0f s: what it has not sent yet is left behind", self.name,
                        timeout_s)


class Trackers:
    """The run's trackers by name (``openers``: name → a function opening its run), called alike."""

    def __init__(self, openers: Mapping[str, Callable[[], Tracker]]) -> None:
        self._lanes = [_Lane(name, opener) for name, opener in openers.items()]

    @property
    def names(self) -> list[str]:
        """The trackers not dropped."""
        return [lane.name for lane in self._lanes if not lane.failed]

    def __bool__(self) -> bool:
        return bool(self._lanes)

    def _each(self, call: Callable[[Tracker], Any]) -> None:
        for lane in self._lanes:
            lane.submit(call)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._each(lambda tracker: tracker.log_config(config))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if metrics:
            self._each(lambda tracker: tracker.log_metrics(step, dict(metrics)))

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._each(lambda tracker: tracker.log_table(step, name, list(rows)))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Flush and end every tracker's run (each waited for up to ``timeout_s``)."""
        for lane in self._lanes:
            lane.close(timeout_s)
