"""What every built-in task is: a conversation to start from, the tools it offers, and a verifier of the answer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

ANSWER = re.compile(r"Answer:[ \t]*([^\n]*)")


def final_answer(text: str) -> str | None:
    """What follows the last ``Answer:`` of a reply, to the end of its line (spaces and a final period trimmed)."""
    found = ANSWER.findall(text or "")
    return found[-1].strip().rstrip(".").strip() if found else None


@dataclass
class Task:
    task_id: str
    domain: str
    messages: list[dict[str, Any]]                 # the conversation the agent starts from
    answer: str                                    # the verified final answer
    tools: list[dict[str, Any]] | None = None
    values: dict[str, str] = field(default_factory=dict)   # hidden tool data (agent tasks)

    def score(self, reply: str) -> float:
        """1.0 when the reply's final answer is right, else 0.0."""
        return 1.0 if final_answer(reply) == self.answer else 0.0
