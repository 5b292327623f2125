"""Sandboxes at RL concurrency: a fixed set of slots, each a directory and (run as root) a user of its own, handed to
one session at a time and wiped between sessions, so a session's sandbox is ready in the time it takes to copy its
task's files. A session beyond the pool's size waits for a slot."""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from forge.rollout.sandbox.config import SandboxConfig
from forge.rollout.sandbox.sandbox import Sandbox


class SandboxPool:
    def __init__(self, directory: Path, config: SandboxConfig) -> None:
        self.directory = Path(directory)
        self.config = config
        self.directory.mkdir(parents=True, exist_ok=True)
        as_root = os.getuid() == 0
        self._free: queue.Queue[Sandbox] = queue.Queue()
        for slot in range(config.pool_size):
            self._free.put(Sandbox(self.directory / f"slot-{slot}", config, config.first_uid + slot if as_root
                                   else None))

    def acquire(self, seed: Path | None = None, timeout_s: float | None = None) -> Sandbox:
        """A wiped sandbox whose workspace is a copy of ``seed``; waits for a free slot (queue.Empty past
        ``timeout_s``)."""
        sandbox = self._free.get(timeout=timeout_s)
        try:
            sandbox.reset(seed)
        except BaseException:
            self._free.put(sandbox)
            raise
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """Wipe ``sandbox`` and free its slot (its commands have all ended: each run's namespace ends with it)."""
        shutil.rmtree(sandbox.workspace, ignore_errors=True)
        self._free.put(sandbox)

    @contextmanager
    def session(self, seed: Path | None = None) -> Iterator[Sandbox]:
        sandbox = self.acquire(seed)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    @asynccontextmanager
    async def async_session(self, seed: Path | None = None) -> AsyncIterator[Sandbox]:
        """``session`` for an event loop: waiting and copying happen off it."""
        sandbox = await asyncio.to_thread(self.acquire, seed)
        try:
            yield sandbox
        finally:
            await asyncio.to_thread(self.release, sandbox)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


__all__ = ["SandboxPool"]
