"""Work on large inputs away from the gateway's event loop: decoding a large JSON body, checking and rendering a long
conversation, tokenising a long prompt. Small inputs stay on the loop, where they cost less than a hop.

Pure-Python work in a thread still holds the GIL between bytecodes, so the loop gets it back within the switch
interval; one C call that holds it (``json.loads`` scanning one long string) blocks the loop for its whole length.
The thread pool therefore has few threads: more would only queue such calls before the loop, not beside it.
Tokenising releases the GIL (``Tokenizer.encode``).

The largest bodies are decoded in a separate process (``run_isolated``), which holds no lock the loop needs. It runs
at a lower CPU priority: a stream of huge bodies then takes only the CPU that the loop, the actors and the pool
leave, instead of slowing every small call on a busy machine. It starts with the first such body; if it dies (the
kernel may kill it for memory), that call fails with 503 and the next one starts a new process. It runs under a
memory limit (``RLIMIT_AS``: what it holds at start plus ``memory_bytes``), so a body whose decoding would take
more fails that request alone with a 413, instead of the kernel choosing what to kill."""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from forge.gateway.errors import TooLarge, Unavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

INLINE_SIZE = 4096          # bytes of a body, characters of a text: up to this, work runs on the loop
PROCESS_SIZE = 1 << 20      # bytes of a body: past this, run_isolated decodes it in the separate process
WORKERS = 2
PROCESS_NICENESS = 10
PARENT_CHECK_S = 0.5          # how often the decoding process checks that the gateway is alive
MEMORY_BYTES = 1 << 30        # what the decoding process may allocate beyond what it holds at start


def _virtual_size() -> int:
    """The address space this process holds now (bytes), what RLIMIT_AS counts."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _start_worker(niceness: int, parent: int, memory_bytes: int, preload: tuple[str, ...]) -> None:
    """In the decoding process: lower its priority, import the modules of the work it will run (a shared library
    mapped later would count against the limit), limit its memory, and end it when the gateway is gone (a worker of
    a process pool holds its own end of the task pipe, so it would otherwise wait for work forever after a
    ``kill -9``)."""
    os.nice(niceness)
    for module in preload:
        importlib.import_module(module)
    limit = _virtual_size() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    def exit_with_parent() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=exit_with_parent, name="parent-watch", daemon=True).start()


class OffLoop:
    def __init__(self, workers: int = WORKERS, inline_size: int = INLINE_SIZE, process_size: int = PROCESS_SIZE,
                 niceness: int = PROCESS_NICENESS, memory_bytes: int = MEMORY_BYTES, preload: tuple[str, ...] = ()
                 ) -> None:
        """``preload``: the modules of the functions ``run_isolated`` will be given, imported as the separate
        process starts."""
        self.inline_size = inline_size
        self.preload = preload
        self.process_size = process_size
        self.niceness = niceness
        self.memory_bytes = memory_bytes
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gateway-work")
        self._processes: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``: on the loop when ``size`` (of the input it works on) is small, else in the thread pool."""
        if size <= self.inline_size:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args))

    async def run_isolated(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """As ``run``, but past ``process_size`` in the separate process: ``fn`` is a module-level function and
        ``args`` and the result (or the exception) are picklable."""
        if size <= self.process_size:
            return await self.run(size, fn, *args)
        processes = self._process_pool()
        try:
            return await asyncio.get_running_loop().run_in_executor(processes, functools.partial(fn, *args))
        except MemoryError:
            raise TooLarge(f"decoding this request needs more than the {self.memory_bytes >> 20} MiB the gateway's "
                           "decoding process may take; send a smaller body") from None
        except BrokenProcessPool:
            self._discard(processes)
            log.warning("the process decoding large request bodies died; a new one starts with the next")
            raise Unavailable("the gateway's decoding process died while reading this request (out of memory?); "
                              "retry, or send a smaller body") from None

    def _process_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise Unavailable("the gateway is shutting down")
            if self._processes is None:
                # spawn, not fork: the gateway runs gRPC threads, which a forked child must not inherit
                self._processes = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                      initializer=_start_worker,
                                                      initargs=(self.niceness, os.getpid(), self.memory_bytes,
                                                                self.preload))
                log.info("started a process for decoding request bodies over %d bytes", self.process_size)
            return self._processes

    def _discard(self, processes: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._processes is processes:
                self._processes = None
        processes.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._closed = True
            processes, self._processes = self._processes, None
        if processes is not None:
            processes.shutdown(wait=True, cancel_futures=True)
