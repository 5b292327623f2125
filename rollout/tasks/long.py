"""Long-context agent tasks: the agent tasks' lookups, but each answers with a long page of records, and the agent
must keep one fact across the pages that follow ("Find the colors of cup and pen." → lookup cup → a
page in which "The cup is red." is one line among records of other objects and of other owners' cups → lookup pen
→ another page → "Answer: red blue").

The context-management action keeps the session within the model's window: once a later tool round has come, each
older page is cut down to its lines naming an object the task asks about, so the facts stay in context (among the
other owners' records of the same objects) while the rest of the page goes. ``page_lines`` sets how long a session
gets: about 8 tokens a line on the built-in tokenizer, a page per object asked about.

The prompts are the agent tasks' (so the built-in models, pre-trained on those, call the tool), the tool's
description tells them apart. The built-in models were not pre-trained on the pages themselves: these tasks are for
exercising long sessions end to end, and for models with long windows."""

from __future__ import annotations

import random
import re
from typing import Any

from forge.rollout.tasks.agent import COLORS, OBJECTS, asked
from forge.rollout.tasks.base import Task
from forge.rollout.tasks.names import name

DOMAIN = "long"
PAGE_LINES = 40
OWNED_SHARE = 0.25          # lines about another owner's object of the same kind as one asked about
RECORDS = {"type": "function", "function": {
    "name": "lookup", "description": "The records that mention a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}


def fact(key: str, color: str) -> str:
    return f"The {key} is {color}."


def owned(rng: random.Random, kind: str) -> str:
    return f"{name(rng)}'s {kind} is {rng.choice(COLORS)}."


def page(rng: random.Random, key: str, color: str, asked: list[str], lines: int) -> str:
    """``lines`` records: the fact about ``key`` once, at a random place; the rest about objects not asked about
    (stated as facts are) or about other owners' objects of the asked kinds, another owner's ``key`` among them."""
    others = [o for o in OBJECTS if o not in asked]
    records = [owned(rng, key)] if lines > 1 else []
    records += [owned(rng, rng.choice(asked)) if rng.random() < OWNED_SHARE
                else fact(rng.choice(others), rng.choice(COLORS)) for _ in range(lines - 2)]
    rng.shuffle(records)
    records.insert(rng.randrange(lines), fact(key, color))
    return "\n".join(records)


def make(rng: random.Random, task_id: str, page_lines: int = PAGE_LINES) -> Task:
    if page_lines < 1:
        raise ValueError(f"a page holds at least one line, got {page_lines}")
    colors, prompt = asked(rng)
    pages = {key: page(rng, key, color, list(colors), page_lines) for key, color in colors.items()}
    return Task(task_id, DOMAIN, [{"role": "user", "content": prompt}], " ".join(colors.values()), tools=[RECORDS],
                values=pages)


def _naming(keys: list[str]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(re.escape(k) for k in keys) + r")\b")


def manage_context(task: Task, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The context-management action: every page older than the latest tool round is cut to its lines naming an
    object the task asks about. Returns the messages unchanged when there is nothing to cut."""
    rounds = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls")]
    if len(rounds) < 2:
        return messages
    naming = _naming(list(task.values))
    managed, cut = [], False
    for index, message in enumerate(messages):
        if message["role"] == "tool" and index < rounds[-1]:
            kept = "\n".join(line for line in message["content"].splitlines() if naming.search(line))
            if kept != message["content"]:
                message, cut = {**message, "content": kept}, True
        managed.append(message)
    return managed if cut else messages
