"""The gateway's event loop in its own thread, and the way threads (gRPC handlers) run coroutines and async
streams on it: results, exceptions and cancellation cross over intact."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()


class LoopThread:
    def __init__(self, name: str = "gateway-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stream(self, make: Callable[[], AsyncIterator[T]]) -> LoopStream[T]:
        return LoopStream(self.loop, make)

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class LoopStream(Iterator[T]):
    """Iterate, from a thread, an async iterator that runs on the loop; ``cancel()`` stops it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, make: Callable[[], AsyncIterator[T]]) -> None:
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._future = asyncio.run_coroutine_threadsafe(self._pump(make), loop)

    async def _pump(self, make: Callable[[], AsyncIterator[T]]) -> None:
        source = make()
        try:
            async for item in source:
                self._items.put((item, None))
        except asyncio.CancelledError:
            self._items.put((_END, None))
            raise
        except BaseException as exc:
            self._items.put((_END, exc))
            return
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
        self._items.put((_END, None))

    def __next__(self) -> T:
        item, error = self._items.get()
        if item is _END:
            self._items.put((_END, error))
            if error is not None:
                raise error
            raise StopIteration
        return item

    def cancel(self) -> None:
        self._future.cancel()
