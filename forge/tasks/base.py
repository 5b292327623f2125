"""What every built-in task is: a conversation to start from, the tools it offers, and a verifier of the answer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

ANSWER = re.compile(r"Answer:\s*(-?[A-Za-z0-9]+)")


def final_answer(text: str) -> str | None:
    """The value after the last ``Answer:`` in a reply, if any."""
    found = ANSWER.findall(text or "")
    return found[-1] if found else None


@dataclass
class Task:
    task_id: str
    domain: str
    messages: list[dict[str, Any]]                 # the conversation the agent starts from
    answer: str                                    # the verified final answer
    tools: list[dict[str, Any]] | None = None
    values: dict[str, int] = field(default_factory=dict)   # hidden tool data (agent tasks)

    def score(self, reply: str) -> float:
        """1.0 when the reply's final answer is right, else 0.0."""
        return 1.0 if final_answer(reply) == self.answer else 0.0
