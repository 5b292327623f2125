"""The built-in tasks as a team's task source: reasoning, QA and agent tasks as task dicts (``forge.rollout.tasks.source``)
with their verifier, so that a run file can train any agent on them like on its own tasks:

    [tasks]
    source = "forge.rollout.tasks.builtin_source:train"
    eval_fraction = 0.05
    verifier = "forge.rollout.tasks.builtin_source:score"

Each dict carries the task's hidden tool data (``values``) for the agent and its right answer (``answer``) for the
verifier; ``examples/blackbox/agent.py`` plays all three domains."""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any

from forge.rollout.tasks import DOMAINS, Task, eval_set, final_answer, task_stream


def task_dict(task: Task) -> dict[str, Any]:
    """A built-in task as a task line: id, domain, messages, tools (when it has any), values and answer."""
    fields = asdict(task)
    line = {"id": fields["task_id"], "domain": fields["domain"], "messages": fields["messages"],
            "values": fields["values"], "answer": fields["answer"]}
    if fields["tools"]:
        line["tools"] = fields["tools"]
    return line


def train(count: int = 3072, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` training tasks cycling through the domains, none with a held-out prompt."""
    return [task_dict(t) for t in itertools.islice(task_stream(DOMAINS, seed), count)]


def held_out(size: int = 48) -> list[dict[str, Any]]:
    """The fixed held-out tasks of every domain (``size`` each)."""
    return [task_dict(t) for domain in DOMAINS for t in eval_set(domain, size)]


def score(task: dict[str, Any], reply: str, session: dict[str, Any]) -> dict[str, float]:
    """1 when the reply's final ``Answer:`` is the task's answer, as the built-in runs score it."""
    return {"correct": 1.0 if final_answer(reply) == task["answer"] else 0.0}
