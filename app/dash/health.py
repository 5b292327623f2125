"""The services' health for the dash: ``forge top``'s discovery and poller (``forge.app.top``) in a background
thread, its latest snapshot kept for the page to ask for."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forge.app.top.cli import finite
from forge.app.top.discovery import Target, discover
from forge.app.top.poller import Poller
from forge.app.top.snapshot import snapshot

log = logging.getLogger(__name__)


class Health:
    """Polls every ``interval_s`` the services of ``run_dir`` (read again each round) and ``targets``."""

    def __init__(self, run_dir: Path | None, targets: Sequence[Target] = (), api_key: str | None = None,
                 interval_s: float = 2.0, timeout_s: float = 1.0) -> None:
        self.poller = Poller(lambda: discover(run_dir, targets), api_key=api_key, timeout_s=timeout_s)
        self.interval_s = interval_s
        self._latest: dict[str, Any] = {"time": None, "up": 0, "down": 0, "services": []}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="forge-dash-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def latest(self) -> dict[str, Any]:
        with self._lock:
            return self._latest

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                data = finite(snapshot(self.poller.poll()))
            except Exception:        # a round that fails (a bad services.json being written) must not end the polls
                log.exception("polling the services failed")
            else:
                with self._lock:
                    self._latest = data
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.poller.close()
