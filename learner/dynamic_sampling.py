"""DAPO's dynamic sampling (Yu et al. 2025, ``[learner.reward] dynamic_sampling``): a batch's groups whose sessions
all have the same return carry no advantage, so they are dropped before the step and as many entries are taken
again from the pool, through the same windowed FIFO, until the batch has as many groups as it first took or the
pool has none within ``--max-wait``.

Every entry taken is consumed once, as the FIFO consumes it: a dropped group is consumed and not trained (its
position in ``Batch.dropped``), a kept one is trained; the batch's seq is the cursor after the last take, so a
checkpoint's cursor covers both and a restarted learner takes neither again."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from forge.learner.rewards import RewardConfig, constant_group, group_rewards
from forge.pool import Batch, WindowedFifo
from forge.v1 import pool_pb2


def informative(entry: pool_pb2.QueueEntry, config: RewardConfig) -> bool:
    """Whether the group's sessions' returns differ (the group has an advantage to learn from)."""
    return not constant_group(group_rewards(list(entry.sessions), config))


def filled_batch(fifo: WindowedFifo, config: RewardConfig, should_stop: Callable[[], bool] = lambda: False
                 ) -> Batch | None:
    """The FIFO's next batch with its constant groups replaced: entries whose groups differ (in the order taken),
    ``dropped`` the positions of the others. None when the FIFO has none; a batch with no entries left (every group
    constant and nothing to replace them) is still returned, for its cursor and its dropped positions."""
    taken = fifo.next_batch(should_stop)
    if taken is None:
        return None
    target, waited = len(taken.entries), 0.0
    kept: list[tuple[pool_pb2.QueueEntry, tuple[int, int]]] = []
    dropped: list[int] = []
    while True:
        waited += taken.waited_s
        for entry, at in zip(taken.entries, taken.taken_at, strict=True):
            if informative(entry, config):
                kept.append((entry, at))
            else:
                dropped.append(entry.position)
        missing = target - len(kept)
        more = _take(fifo, missing, should_stop) if missing and not should_stop() else None
        if more is None:
            break
        taken = more
    # The cursor (seq, head, tail) after the last take: it covers every entry consumed, kept or dropped.
    return dataclasses.replace(taken, entries=[e for e, _ in kept], taken_at=[at for _, at in kept], waited_s=waited,
                               dropped=dropped)


def _take(fifo: WindowedFifo, count: int, should_stop: Callable[[], bool]) -> Batch | None:
    """Up to ``count`` more entries from the pool, waiting at most ``--max-wait`` for the first."""
    config = dataclasses.replace(fifo.config, batch_groups=count, min_groups=1)
    deadline = time.monotonic() + config.max_wait_s + 2 * config.poll_s
    return WindowedFifo(fifo.pool, config).next_batch(lambda: should_stop() or time.monotonic() > deadline)
