"""The torch engine's L3 link with no cache server: publishing never blocks the engine (it drops when its queue is
full), and group rollouts behind a cached system prompt compute their task prompt once."""

from __future__ import annotations

import threading
import time

import pytest

from forge.actors.backend import GenerationRequest
from forge.actors.engine.l3 import KVConnector
from forge.model import CausalLM
from forge.sampling.params import SamplingParams

from helpers.engines import make_model
from helpers.l3_engines import BLOCK, generate, l3_engine, prompt_of


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model(0)


make_engine = l3_engine


class StuckClient:
    def __init__(self) -> None:
        self.release = threading.Event()

    def put(self, blocks):
        self.release.wait(30)
        return len(blocks), 0

    def close(self) -> None:
        self.release.set()


def test_publishing_never_blocks_the_engine_and_drops_when_its_queue_is_full(model):
    engine = make_engine(model, fetch="never")
    stuck = StuckClient()
    KVConnector(engine, stuck, fetch="never", publish_queue=2)
    try:
        started = time.monotonic()
        for seed in range(4):
            generate(engine, prompt_of(10 + seed, 100))
        assert time.monotonic() - started < 20
        stats = engine.stats()
        assert stats["l3_publish_dropped"] > 0 and stats["finished"] == 4
    finally:
        stuck.release.set()
        engine.close()


def test_group_rollouts_behind_a_cached_system_prompt_compute_their_task_prompt_once(model):
    engine = make_engine(model, fetch="never")
    try:
        system, task = prompt_of(20, 4 * BLOCK), prompt_of(21, 5 * BLOCK)
        generate(engine, [*system, 1], tokens=1)                       # the system prompt is cached
        before = engine.blocks.hit_tokens
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        with engine._lock:                                               # the four arrive in one engine step
            streams = [engine.submit(GenerationRequest("", [*system, *task, 50 + i], params)) for i in range(4)]
        for stream in streams:
            list(stream)
        # the first computes the task blocks; the other three wait one step and reuse them
        assert engine.blocks.hit_tokens - before == 4 * len(system) + 3 * len(task)
    finally:
        engine.close()
