"""Agent tasks: multi-turn tool use with simulated tool latency ("Find the colors of cup and pen." → lookups →
"Answer: red blue"). Lookups issued together in one turn run concurrently, so they finish sooner than one by one and the
completion-time reward pays for parallelism; malformed tool calls cost a process reward; and once the history holds
more than a few tool results the agent rewrites its own context, replacing them by a note of the values found."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from forge.rollout.tasks.base import Task

DOMAIN = "agent"
COLORS = ("red", "blue", "green", "black", "white", "gold", "gray", "pink")
OBJECTS = ("cup", "box", "pen", "hat", "key", "bag", "lamp", "book", "ring", "coin", "shoe", "bell")
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Color of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
MALFORMED_PENALTY = -0.5
MAX_TOOL_MESSAGES = 2
FORMAT_HINT = 'Malformed tool call. Use <tool_call>{"name": "lookup", "arguments": {"key": KEY}}</tool_call>.'


def asked(rng: random.Random) -> tuple[dict[str, str], str]:
    """Two or three objects with their hidden colors, and the prompt asking for them."""
    keys = rng.sample(OBJECTS, rng.choice((2, 2, 3)))
    values = {key: rng.choice(COLORS) for key in keys}
    listed = " and ".join(keys) if len(keys) == 2 else f"{keys[0]}, {keys[1]} and {keys[2]}"
    return values, f"Find the colors of {listed}."


def make(rng: random.Random, task_id: str) -> Task:
    values, prompt = asked(rng)
    return Task(task_id, DOMAIN, [{"role": "user", "content": prompt}], " ".join(values.values()), tools=[LOOKUP],
                values=values)


def call_message(keys: list[str], ids: list[str]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"key": k})}}
        for k, i in zip(keys, ids, strict=True)]}


def known_note(found: dict[str, str]) -> dict[str, Any]:
    return {"role": "user", "content": "Known: " + ", ".join(f"{k}={v}" for k, v in found.items()) + "."}


def manage_context(task: Task, messages: list[dict[str, Any]], found: dict[str, str]) -> list[dict[str, Any]]:
    """The context-management action: past MAX_TOOL_MESSAGES tool results, keep the task and a note of the values
    found instead of the whole exchange. Returns the messages unchanged when there is nothing to do."""
    if sum(1 for m in messages if m["role"] == "tool") <= MAX_TOOL_MESSAGES:
        return messages
    return [*task.messages, known_note(found)]


@dataclass
class ToolOutcome:
    results: list[tuple[str, str]] = field(default_factory=list)   # (tool call id, result text)
    found: dict[str, str] = field(default_factory=dict)            # key -> value looked up
    process_reward: float = 0.0


class ToolEnvironment:
    """Runs an agent's tool calls against a task's hidden values, each after ``latency_s`` seconds; calls of one
    turn run concurrently."""

    def __init__(self, task: Task, latency_s: float = 0.3) -> None:
        self.task = task
        self.latency_s = latency_s

    async def _lookup(self, call: dict[str, Any]) -> tuple[str, str | None, bool]:
        await asyncio.sleep(self.latency_s)
        function = call.get("function", call)
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            key = arguments["key"]
        except (ValueError, KeyError, TypeError):
            return "error: arguments must be a JSON object with a key", None, False
        if function.get("name") != "lookup":
            return f"error: unknown tool {function.get('name')!r}", None, False
        if key not in self.task.values:
            return f"error: unknown key {key!r}", None, True
        return str(self.task.values[key]), key, True

    async def run(self, calls: list[dict[str, Any]]) -> ToolOutcome:
        outcome = ToolOutcome()
        answers = await asyncio.gather(*(self._lookup(call) for call in calls))
        for call, (text, key, well_formed) in zip(calls, answers, strict=True):
            outcome.results.append((call.get("id", ""), text))
            if key is not None:
                outcome.found[key] = text
            if not well_formed:
                outcome.process_reward += MALFORMED_PENALTY
        return outcome


def teacher_conversation(task: Task, rng: random.Random, error_rate: float) -> list[dict[str, Any]]:
    """A demonstration for pre-training: parallel or one-by-one lookups (sometimes a malformed call first), context
    rewrites as the agent does them, and a final answer that is wrong with probability ``error_rate``."""
    keys = list(task.values)
    messages = list(task.messages)
    found: dict[str, str] = {}
    if rng.random() < 0.15:
        bad = f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{keys[0]}"}}</tool_call>'
        messages += [{"role": "assistant", "content": bad}, {"role": "user", "content": FORMAT_HINT}]
    rounds = [keys] if rng.random() < 0.4 else [[k] for k in keys]
    counter = 0
    for batch in rounds:
        ids = [f"call_{counter + i}" for i in range(len(batch))]
        counter += len(batch)
        messages.append(call_message(batch, ids))
        for key, call_id in zip(batch, ids, strict=True):
            found[key] = str(task.values[key])
            messages.append({"role": "tool", "tool_call_id": call_id, "content": found[key]})
        messages = manage_context(task, messages, found)
    answer = list(task.values.values())
    if rng.random() < error_rate:
        answer[rng.randrange(len(answer))] = rng.choice(COLORS)
    messages.append({"role": "assistant", "content": f"Answer: {' '.join(answer)}"})
    return messages
