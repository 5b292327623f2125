"""Continuous batching: which sequences run in the next step.

Sequences wait in FIFO order and are admitted while the KV budget, the batch size and the step's token budget
allow. A request whose first uncached prompt block is one another request computes in the same step waits one step,
so the G rollouts of one prompt compute its prefix once and share it (also behind a cached system prompt). A step
is either a prefill step (prompts, or chunks of long prompts, of newly admitted sequences) or a decode step (one
token, plus the MTP draft when speculating, for every sequence whose prompt is done). While a prompt of many chunks
is prefilled (100k tokens is 25 steps at the default budget), its chunks take ``prefill_share`` of the engine's time
when other sequences are decoding: a chunk's step earns them (1 − share) / share of its duration in decode steps,
run before the next chunk, so a long prompt slows the sequences beside it instead of stopping them; and new
requests are admitted beside its chunks with half the step's budget. When a decode step runs out of KV blocks,
the most recently admitted sequence is preempted: its blocks are freed and it returns to the front of the queue, to
be recomputed (with whatever prefix blocks survived) when it is admitted again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from forge.actors.engine.block_manager import BlockManager
from forge.actors.engine.runner import Work
from forge.actors.engine.sequence import Sequence, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64              # sequences running at once
    max_num_batched_tokens: int = 4096  # tokens fed in one prefill step (long prompts are chunked)
    speculative: bool = False          # MTP layer: recompute the last cached token, keep slots for draft and bonus
    prefill_share: float = 1.0         # the time a long prompt's chunks take while others decode (1: all)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.decode_credit = 0.0        # seconds of decode steps owed to the others by a long prompt's chunks
        self._chunking = False          # the last step left a prompt unfinished
        self._paying = False            # the last step was a decode step run on that credit

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @staticmethod
    def needs_prefill(seq: Sequence) -> bool:
        """Whether the sequence still has prompt tokens to feed (rather than its last sampled token)."""
        return seq.num_pending > 1 or (seq.num_pending == 1 and seq.num_output == 0)

    def _prefill_work(self, seq: Sequence, budget: int) -> Work:
        cached = seq.num_computed
        after_prefix_hit = cached > 0 and cached == seq.prefix_hit_tokens
        start = cached - 1 if self.config.speculative and after_prefix_hit else cached
        end = min(len(seq), start + max(1, budget))
        return Work(seq, start, end, write_from=cached)

    def schedule(self, salt_of: Callable[[Sequence], bytes]) -> list[Work]:
        """``salt_of``: what a sequence's KV blocks are hashed with (its weights' version, its adapter)."""
        self._paying = False
        if self.decode_credit > 0:
            if work := self._decode_work():
                self._paying = True
                return work
            self.decode_credit = 0.0
        work = self._prefill_step(salt_of)
        self._chunking = any(item.end < len(item.seq) for item in work)
        return work or self._decode_work()

    def ran(self, elapsed: float) -> None:
        """The step just scheduled took ``elapsed`` seconds: one that left a prompt unfinished owes the decoding
        sequences their share of the time; a decode step run on that credit spends it (the last one may overrun it:
        no debt is carried, so every chunk is followed by a decode step at least)."""
        if self._paying:
            self.decode_credit = max(0.0, self.decode_credit - elapsed)
        elif self._chunking and self.config.prefill_share < 1:
            self.decode_credit += elapsed * (1 - self.config.prefill_share) / self.config.prefill_share

    def _prefill_step(self, salt_of: Callable[[Sequence], bytes]) -> list[Work]:
        """Unfinished prompts of running sequences (chunked prefill) and new admissions, within the step's budget.
        While a prompt is being chunked, new requests come first with half the budget: a long prompt neither keeps
        them out for the whole of its prefill nor is starved by them."""
        budget = self.config.max_num_batched_tokens
        continuing = [seq for seq in self.running if self.needs_prefill(seq)]
        computing: set[bytes] = set()     # prefix blocks this step computes: same-prefix requests wait one step
        work = self._admit(salt_of, budget // 2, computing) if continuing else []
        budget -= sum(item.end - item.start for item in work)
        for seq in continuing:
            if budget <= 0:
                return work
            item = self._prefill_work(seq, budget)
            work.append(item)
            budget -= item.end - item.start
        return work + self._admit(salt_of, budget, computing)

    def _admit(self, salt_of: Callable[[Sequence], bytes], budget: int, computing: set[bytes]) -> list[Work]:
        """Admit waiting requests, in order, while the KV cache, the batch size and ``budget`` allow."""
        work: list[Work] = []
        deferred: list[Sequence] = []
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            salt = salt_of(seq)
            hashes = self.blocks.prompt_block_hashes(seq, salt)
            first_miss = next((i for i, h in enumerate(hashes) if h not in self.blocks.by_hash), len(hashes))
            if first_miss < len(hashes) and hashes[first_miss] in computing:
                deferred.append(self.waiting.popleft())
                continue
            if not self.blocks.can_allocate(seq, salt):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq, salt)
            computing.update(hashes[seq.num_cached_blocks:])
            seq.status = Status.RUNNING
            self.running.append(seq)
            item = self._prefill_work(seq, budget)
            work.append(item)
            budget -= item.end - item.start
        self.waiting.extendleft(reversed(deferred))
        return work

    def _decode_work(self) -> list[Work]:
        """One token (and the draft's slots) for every running sequence whose prompt is done."""
        work: list[Work] = []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or self.needs_prefill(seq):
                continue
            # With the MTP layer: the draft's slot and the MTP slot after the last token (or the bonus token).
            needed = len(seq) + (2 if self.config.speculative else 0)
            while not self.blocks.can_append(seq, needed):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.blocks.ensure_slots(seq, needed)
            work.append(Work(seq, seq.num_computed, len(seq), write_from=seq.num_computed))
        return work

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free_sequence(seq)
        seq.status = Status.WAITING          # its draft is kept and verified after recompute: same tokens for a seed
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self.blocks.free_sequence(seq)
        seq.status = Status.FINISHED
        seq.draft = None
