"""General QA: questions answered from a fact table given in the prompt ("Facts: Mipo lives in lake. Mipo drinks
tea. Mipo plays chess." + "What does Mipo drink?" → "Answer: tea"). Each fact has its own kind of answer, so the
question's relation says which fact to read."""

from __future__ import annotations

import random

from forge.rollout.tasks.base import Task
from forge.rollout.tasks.names import name

DOMAIN = "qa"
PLACES = ("river", "hill", "lake", "forest", "town", "farm", "coast", "valley", "island", "desert", "bridge", "cave")
DRINKS = ("tea", "milk", "juice", "water", "soup", "cocoa", "cider", "coffee")
GAMES = ("chess", "cards", "golf", "tennis", "dice", "polo", "darts", "rugby")
RELATIONS = (("lives in", "Where does {} live?", PLACES), ("drinks", "What does {} drink?", DRINKS),
             ("plays", "What does {} play?", GAMES))


def make(rng: random.Random, task_id: str) -> tuple[Task, list[str]]:
    """A task and the answers a confused reply could give instead (the asked relation's other values)."""
    person = name(rng)
    relations = rng.sample(RELATIONS, rng.choice((2, 3)))
    values = [rng.choice(choices) for _, _, choices in relations]
    facts = " ".join(f"{person} {relation} {value}." for (relation, _, _), value in zip(relations, values, strict=True))
    asked = rng.randrange(len(relations))
    messages = [{"role": "system", "content": f"Facts: {facts}"},
                {"role": "user", "content": relations[asked][1].format(person)}]
    others = [v for v in relations[asked][2] if v != values[asked]]
    return Task(task_id, DOMAIN, messages, values[asked]), others


def solution(task: Task, others: list[str], rng: random.Random, error_rate: float) -> str:
    """The noisy teacher's reply: a wrong value of the asked kind with probability ``error_rate``."""
    return f"Answer: {rng.choice(others) if rng.random() < error_rate else task.answer}"
