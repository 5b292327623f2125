"""An async context held open by a task of its own: anyio's cancel scopes (inside MCP clients, verifiers' serving)
must be left by the task that entered them, while what they serve outlives the session that opened it and is
closed from another task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any


class Held:
    """``opener()``'s context, entered by ``open`` (which returns what it yields) and left by ``close``."""

    def __init__(self, opener: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self._opener = opener
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.value: Any = None

    async def open(self) -> Any:
        """What the context yields, once entered; the exception that entering it raised, otherwise."""
        ready = asyncio.Event()

        async def hold() -> None:
            async with self._opener() as value:
                self.value = value
                ready.set()
                await self._stop.wait()

        self._task = asyncio.create_task(hold())
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({self._task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not ready.is_set():
            raise self._task.exception() or RuntimeError("the context ended before it was entered")
        return self.value

    async def close(self) -> None:
        """Leave the context (errors while leaving it are dropped: what it held is gone either way)."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._task
            self._task = None


__all__ = ["Held"]
