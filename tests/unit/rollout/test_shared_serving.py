"""A verifiers taskset's shared serving is held by a task of its own and started afresh after ``per_serving``
episodes, once those in play have ended (an environment holds one serving at a time); ``Held`` hands back what
entering a context raised."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from forge.rollout.held import Held
from forge.rollout.verifiers_env import SharedServing


class CountingEnv:
    """Stands in for a verifiers Env: only its ``serving()`` is used, and it counts what is open."""

    def __init__(self) -> None:
        self.opened = self.closed = self.open_now = 0
        self.tasks: set[asyncio.Task] = set()

    @contextlib.asynccontextmanager
    async def serving(self):
        self.opened += 1
        self.open_now += 1
        self.tasks.add(asyncio.current_task())
        try:
            yield
        finally:
            self.closed += 1
            self.open_now -= 1
            assert asyncio.current_task() in self.tasks, "left by the task that entered it"


async def settle() -> None:
    for _ in range(20):             # let every ready task run its next steps
        await asyncio.sleep(0)


def test_a_fresh_serving_starts_after_its_share_of_episodes_once_those_in_play_end():
    async def scenario() -> None:
        env = CountingEnv()
        shared = SharedServing(env, per_serving=2)
        first = shared.episode()
        await first.__aenter__()
        async with shared.episode():
            assert env.opened == 1, "the second episode shares the first one's serving"

        async def third() -> None:
            async with shared.episode():
                assert env.open_now == 1

        waiting = asyncio.create_task(third())
        await settle()
        assert not waiting.done() and env.opened == 1, "the third waits for the first to end"
        await first.__aexit__(None, None, None)
        await waiting
        assert (env.opened, env.closed, env.open_now) == (2, 1, 1)
        await shared.close()
        assert env.open_now == 0

    asyncio.run(scenario())


def test_held_hands_back_what_entering_raised():
    @contextlib.asynccontextmanager
    async def refuses():
        raise ConnectionError("no server there")
        yield

    async def scenario() -> None:
        with pytest.raises(ConnectionError, match="no server there"):
            await Held(refuses).open()

    asyncio.run(scenario())
