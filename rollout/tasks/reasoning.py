"""Reasoning: multi-step arithmetic on single digits with a checked final answer ("Compute 7 + 8 - 3." →
"7 + 8 = 15. 15 - 3 = 12. Answer: 12")."""

from __future__ import annotations

import random

from forge.rollout.tasks.base import Task

DOMAIN = "reasoning"


def make(rng: random.Random, task_id: str) -> tuple[Task, list[int], list[str]]:
    """A task, the numbers along the way, and the operators."""
    steps = rng.choice((1, 1, 2))
    numbers = [rng.randrange(0, 10)]
    operators: list[str] = []
    value = numbers[0]
    for _ in range(steps):
        operator = rng.choice("+-")
        operand = rng.randrange(0, 10) if operator == "+" else rng.randrange(0, min(value, 9) + 1)
        value = value + operand if operator == "+" else value - operand
        numbers.append(operand)
        operators.append(operator)
    expression = " ".join([str(numbers[0]), *(f"{o} {n}" for o, n in zip(operators, numbers[1:], strict=True))])
    task = Task(task_id, DOMAIN, [{"role": "user", "content": f"Compute {expression}."}], str(value))
    return task, numbers, operators


def solution(numbers: list[int], operators: list[str], rng: random.Random, error_rate: float) -> str:
    """Worked steps; with ``error_rate`` one step's result is off, and the error carries through."""
    value = numbers[0]
    parts = []
    wrong_step = rng.randrange(len(operators)) if rng.random() < error_rate else -1
    for index, (operator, operand) in enumerate(zip(operators, numbers[1:], strict=True)):
        result = value + operand if operator == "+" else value - operand
        if index == wrong_step:
            result += rng.choice((-2, -1, 1, 2))
        parts.append(f"{value} {operator} {operand} = {result}.")
        value = result
    return " ".join(parts) + f" Answer: {value}"
