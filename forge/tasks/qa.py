"""General QA: questions answered from a fact table given in the prompt ("Where does Mipo live?" → "Answer: lake")."""

from __future__ import annotations

import random

from forge.tasks.base import Task
from forge.tasks.names import distinct_names

DOMAIN = "qa"
PLACES = ("river", "hill", "lake", "forest", "town", "farm", "coast", "valley", "island", "desert", "bridge", "cave")


def make(rng: random.Random, task_id: str) -> tuple[Task, list[str]]:
    count = rng.choice((2, 3))
    people = distinct_names(rng, count)
    places = rng.sample(PLACES, count)
    facts = " ".join(f"{p} lives in {c}." for p, c in zip(people, places, strict=True))
    asked = rng.randrange(count)
    messages = [{"role": "system", "content": f"Facts: {facts}"},
                {"role": "user", "content": f"Where does {people[asked]} live?"}]
    return Task(task_id, DOMAIN, messages, places[asked]), places


def solution(task: Task, places: list[str], rng: random.Random, error_rate: float) -> str:
    answer = task.answer
    if rng.random() < error_rate:
        answer = rng.choice([p for p in places if p != task.answer])
    return f"Answer: {answer}"
