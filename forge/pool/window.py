"""The Windowed FIFO over the Data Pool: which finished work the next training step takes.

With head i and N = tail − i queue entries in flight, a step may take any completed entry in [i, i + W − 1] and
nothing beyond; the window advances only when the head entry is consumed. W is ``window`` itself when it is >= 1,
else ⌈window · N⌉ (the default 0.3 N); ``mode="fifo"`` forces W = 1 (no drift, head-of-line blocking) and
``mode="greedy"`` W = N (maximum throughput, drift toward fast samples). Steps take whole entries, i.e. all G
rollouts of a task together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from forge.settings import Settings, SettingsError, setting
from forge.v1 import pool_pb2


class PoolSource(Protocol):
    """What the learner needs from the pool: ``Pool`` (in-process), ``PoolReader`` + writes, or ``PoolClient``."""

    def cursor(self) -> pool_pb2.Cursor: ...

    def fetch(self, window: int, max_entries: int = 0, include_calls: bool = False) -> pool_pb2.FetchResponse: ...

    def consume(self, positions, failed: bool = False, expected_seq: int | None = None,
                commit: bool = False) -> pool_pb2.Cursor: ...

    def commit_cursor(self, seq: int) -> pool_pb2.Cursor: ...

    def rewind(self, seq: int) -> pool_pb2.Cursor: ...


@dataclass(frozen=True, kw_only=True)
class WindowConfig(Settings):
    mode: str = setting("windowed", choices=("fifo", "windowed", "greedy"),
                        help="fifo: W = 1; windowed: W = --window; greedy: W = all entries in flight.")
    window: float = setting(0.3, min=0, min_open=True,
                            help="W as a count (>= 1) or a fraction of the entries in flight (< 1).")
    batch_groups: int = setting(8, min=1, help="Queue entries (groups of rollouts) per step.")
    min_groups: int = setting(1, min=1, help="After --max-wait, train on this many entries if that is all there is "
                                             "(at most --batch-groups).")
    max_wait_s: float = setting(30.0, flag="max-wait", min=0, help="Seconds to wait for a full batch.")
    poll_s: float = 0.05              # how often an unfinished batch looks at the pool again

    def check(self) -> None:
        if self.min_groups > self.batch_groups:
            raise SettingsError(f"--min-groups ({self.min_groups}) must be at most --batch-groups "
                                f"({self.batch_groups})")

    def size(self, in_flight: int) -> int:
        if self.mode == "fifo":
            return 1
        if self.mode == "greedy":
            return max(1, in_flight)
        if self.window >= 1:
            return int(self.window)
        return max(1, math.ceil(self.window * in_flight))


@dataclass
class Batch:
    entries: list[pool_pb2.QueueEntry]
    seq: int                          # the pool cursor seq once these entries were consumed
    head: int                         # the head when the batch was complete
    tail: int
    window: int                       # the window size last applied
    waited_s: float
    taken_at: list[tuple[int, int]] = field(default_factory=list)   # (head, window) when each entry was taken
    dropped: list[int] = field(default_factory=list)    # positions consumed but not trained (dynamic sampling)


class WindowedFifo:
    """Forms batches the way the design's queue works: taking an entry consumes it, so the head (and with it the
    window) advances as the batch fills. Strict FIFO (W = 1) thus takes the next B entries in order; a wider
    window lets finished entries behind a slow head in, but never one beyond head + W − 1.

    Consumes are made as entries are taken, before training: a learner that dies before its next checkpoint
    rewinds the pool to the checkpoint's seq on restart, so nothing taken is lost or trained twice."""

    def __init__(self, pool: PoolSource, config: WindowConfig) -> None:
        self.pool = pool
        self.config = config

    def next_batch(self, should_stop: Callable[[], bool] = lambda: False) -> Batch | None:
        """``batch_groups`` entries (or at least ``min_groups`` after ``max_wait_s``). When ``should_stop`` turns
        true, the entries already taken are returned (they must be trained, not dropped); None if there are none."""
        config = self.config
        started = time.monotonic()
        taken: list[pool_pb2.QueueEntry] = []
        taken_at: list[tuple[int, int]] = []
        cursor = self.pool.cursor()
        window = config.size(cursor.tail - cursor.head)
        while True:
            if should_stop():
                break
            cursor = self.pool.cursor()
            window = config.size(cursor.tail - cursor.head)
            response = self.pool.fetch(window, max_entries=config.batch_groups - len(taken), include_calls=True)
            if response.entries:
                taken_at += [(response.head, window)] * len(response.entries)
                cursor = self.pool.consume([e.position for e in response.entries], expected_seq=response.seq)
                taken += response.entries
                if len(taken) >= config.batch_groups:
                    break
                continue
            waited = time.monotonic() - started
            if len(taken) >= config.min_groups and waited >= config.max_wait_s:
                break
            time.sleep(config.poll_s)
        if not taken:
            return None
        return Batch(taken, cursor.seq, cursor.head, cursor.tail, window, time.monotonic() - started, taken_at)
