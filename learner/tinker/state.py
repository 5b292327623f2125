"""What a running forge-tinker holds: its settings, its two parts (``Training``, ``Sampling``), the registry of who
owns what, the futures, the counters Stats reports, and the one worker thread every ``Training`` call runs on.

One thread for every model, not one per model: the clients' LoRA adapters sit on one shared base model, and which
adapter is active is state of that shared model, so two models' passes must not interleave mid-call; torch releases
the GIL inside its kernels, so the event loop stays free while the thread computes. Calls on one model are ordered
by ``OrderedRunner`` before they reach the thread."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from forge.learner.tinker.config import TinkerConfig
from forge.learner.tinker.errors import bad_request
from forge.learner.tinker.futures import FutureStore
from forge.learner.tinker.sessions import Registry
from forge.learner.tinker.types import Sampling, Training

T = TypeVar("T")


class TinkerState:
    def __init__(self, config: TinkerConfig, training: Training, sampling: Sampling | None) -> None:
        self.config = config
        self.training = training
        self.sampling = sampling
        self.registry = Registry()
        self.futures = FutureStore(max_pending=config.max_pending)
        self.counts: Counter[str] = Counter()
        self.started = time.time()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="tinker-training")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the training thread."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def check_base_model(self, name: Any) -> str:
        if not isinstance(name, str) or name not in self.config.base_models:
            raise bad_request(f"base model {name!r} is not served here (served: {', '.join(self.config.base_models)})")
        return name

    def gauges(self) -> dict[str, float]:
        sessions = list(self.registry.sessions.values())
        return {
            "sessions": sum(1 for s in sessions if s.finished is None),
            "models": len(self.registry.models),
            "samplers": len(self.registry.samplers),
            "futures_pending": self.futures.pending,
            "futures_completed": self.futures.completed,
            "futures_failed": self.futures.failed,
            **{k: float(v) for k, v in list(self.counts.items())},
        }

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
