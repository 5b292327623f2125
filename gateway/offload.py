"""Work on large inputs away from the gateway's event loop: decoding a large JSON body, checking and rendering a long
conversation, tokenising a long prompt. Small inputs stay on the loop, where they cost less than a thread hop.

Pure-Python work in a thread still holds the GIL between bytecodes, so the loop gets it back within the switch
interval; one C call that holds it (``json.loads`` scanning one long string) blocks the loop for its whole length.
The pool therefore has few threads: more would only queue such calls before the loop, not beside it. Tokenising
releases the GIL (``Tokenizer.encode``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

INLINE_SIZE = 4096          # bytes of a body, characters of a text: up to this, work runs on the loop
WORKERS = 2


class OffLoop:
    def __init__(self, workers: int = WORKERS, inline_size: int = INLINE_SIZE) -> None:
        self.inline_size = inline_size
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gateway-work")

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``: on the loop when ``size`` (of the input it works on) is small, else in the pool."""
        if size <= self.inline_size:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
