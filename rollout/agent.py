"""The white-box agent: runs one episode of a built-in task against a ``ChatLLM`` and says how it went.

Reasoning and QA episodes are one call. Agent episodes loop: the model's tool calls run in the tool environment
(concurrently within a turn), their results go back as tool messages, a malformed call earns a process reward and a
format hint (so does a last reply that gives no answer), and the agent manages its own context as its task's domain
does it (``forge.rollout.tasks.manage_context``: past a few tool results a note of the values found replaces the exchange;
long tasks cut older pages down to the lines about what is asked). The episode ends with an answer, or after
``max_turns``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from forge.rollout.llm import ChatLLM
from forge.rollout.tasks import Task, manage_context
from forge.rollout.tasks.agent import FORMAT_HINT, MALFORMED_PENALTY, ToolEnvironment
from forge.rollout.tasks.base import final_answer
from forge.sampling.params import SamplingParams


@dataclass
class Episode:
    task: Task
    reply: str = ""
    reward: float = 0.0
    turns: int = 0
    tool_rounds: int = 0
    context_rewrites: int = 0
    seconds: float = 0.0
    process_rewards: dict[int, float] = field(default_factory=dict)    # call index -> reward
    failed: str = ""

    @property
    def metrics(self) -> dict[str, float]:
        return {"completion_time_s": self.seconds, "turns": float(self.turns), "tool_rounds": float(self.tool_rounds),
                "context_rewrites": float(self.context_rewrites), "correct": self.reward}


async def run_episode(task: Task, llm: ChatLLM, sampling: SamplingParams, tool_latency_s: float = 0.3,
                      max_turns: int = 6) -> Episode:
    episode = Episode(task)
    started = time.perf_counter()
    messages: list[dict[str, Any]] = [dict(m) for m in task.messages]
    environment = ToolEnvironment(task, tool_latency_s)
    found: dict[str, str] = {}
    for turn in range(max_turns):
        reply = await llm.chat(messages, task.tools, sampling)
        episode.turns = turn + 1
        if reply.finish_reason in ("abort", "error"):
            episode.failed = f"the model call ended with {reply.finish_reason}"
            break
        if task.tools and reply.tool_calls:
            outcome = await environment.run(reply.tool_calls)
            episode.tool_rounds += 1
            if outcome.process_reward:
                episode.process_rewards[reply.call_index] = outcome.process_reward
            found.update(outcome.found)
            messages.append(reply.message())
            messages += [{"role": "tool", "tool_call_id": call_id, "content": text}
                         for call_id, text in outcome.results]
            managed = manage_context(task, messages, found)
            episode.context_rewrites += managed is not messages
            messages = managed
            continue
        if task.tools and reply.malformed_tool_call:
            episode.process_rewards[reply.call_index] = MALFORMED_PENALTY
            messages += [reply.message(), {"role": "user", "content": FORMAT_HINT}]
            continue
        episode.reply = reply.content
        if task.tools and final_answer(reply.content) is None:
            # Neither a tool call nor an answer is a format error too: otherwise an empty reply (reward 0) beats
            # trying a tool call that might be malformed, and the policy learns to say nothing.
            episode.process_rewards[reply.call_index] = MALFORMED_PENALTY
        break
    episode.reward = task.score(episode.reply)
    episode.seconds = time.perf_counter() - started
    return episode
