"""Demonstrations of the built-in tasks by a noisy teacher, right only part of the time: what the built-in models are
pre-trained on (``forge.app.pretrain``) and what the built-in tokenizer is trained on (its words become whole
tokens). Prompts held out for evaluation are never demonstrated."""

from __future__ import annotations

import random

from forge.rollout.tasks import agent, qa, reasoning, unseen

ERROR_RATES = {"reasoning": 0.35, "qa": 0.3, "agent": 0.35}


def demonstration(domain: str, rng: random.Random, index: int) -> tuple[list[dict], list | None]:
    """A noisy teacher's conversation on a task of ``domain`` whose prompt is not held out for evaluation."""
    task_id = f"pretrain-{index}"
    if domain == "reasoning":
        task, numbers, operators = unseen(lambda: reasoning.make(rng, task_id))
        reply = reasoning.solution(numbers, operators, rng, ERROR_RATES[domain])
        return [*task.messages, {"role": "assistant", "content": reply}], None
    if domain == "qa":
        task, others = unseen(lambda: qa.make(rng, task_id))
        return [*task.messages, {"role": "assistant", "content": qa.solution(task, others, rng, ERROR_RATES[domain])}
                ], None
    task = unseen(lambda: agent.make(rng, task_id))
    return agent.teacher_conversation(task, rng, ERROR_RATES[domain]), task.tools
