"""A verifiers environment (its ``verifiers.v1`` API) as any verifiers user writes one: a taskset of sums made from
a seed, no downloads, and a rubric of two weighted reward functions. Forge plays it unchanged (see run.toml); so do
verifiers' own ``vf-eval`` and prime-rl."""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and int(numbers[-1]) == task.answer)

    @vf.reward(weight=0.2)
    async def brief(self, trace) -> float:
        return float(len(trace.last_reply.split()) <= 5)


class ArithConfig(vf.TasksetConfig):
    num_examples: int = 200
    largest: int = 50
    seed: int = 0


class ArithTaskset(vf.Taskset[SumTask, ArithConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for index in range(self.config.num_examples):
            a, b = rng.randint(0, self.config.largest), rng.randint(0, self.config.largest)
            yield SumTask(SumData(id=f"sum-{index}", prompt=f"What is {a} + {b}?", answer=a + b,
                                  system_prompt="Answer with the number alone."), self.config.task)


def load_environment(num_examples: int = 200, largest: int = 50) -> vf.Env:
    """One agent seat with verifiers' plain chat harness, one reply per task."""
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "arith", "num_examples": num_examples, "largest": largest},
        agent={"harness": {"id": "null"}, "max_turns": 1}))


__all__ = ["ArithTaskset"]
