"""The white-box agent interface: a Python class that plays one session of a task, talking to the model through
``llm``, the session's door to the gateway (every call is recorded for training, token-in-token-out). Name it in
the run file (``[agent] python = "my_agents.py:MyAgent"``) and Forge builds one instance per session and awaits
``run``. Unlike a black-box program, it may manage its own context — summarise, truncate or rewrite the history
between calls, each call being its own sample — and attach process rewards to its calls.

    from forge.agents import Agent, AgentResult, LLM

    class MyAgent(Agent):
        async def run(self, task: dict, llm: LLM) -> AgentResult:
            reply = await llm.chat(task["messages"], task.get("tools"))
            return AgentResult(reply.content)

The built-in agents (``forge.rollout.agent``) talk to the model through the same ``chat``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Protocol

from forge.sampling.params import SamplingParams

__all__ = ["LLM", "Agent", "AgentResult", "Reply", "SamplingParams"]


@dataclass
class Reply:
    """The assistant's reply to one call, parsed as the gateway parses it: ``content``, OpenAI-shaped ``tool_calls``,
    ``finish_reason``, and ``call_index``, the call's index in the session (-1 where nothing was recorded)."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)   # OpenAI shape
    finish_reason: str = "stop"
    call_index: int = -1
    completion_tokens: int = 0
    malformed_tool_call: bool = False      # tool-call markup the parser could not read

    def message(self) -> dict[str, Any]:
        """The reply as the assistant message of an OpenAI chat history, which renders back to the sampled text."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class LLM(Protocol):
    """One session's model. ``chat`` renders ``messages`` (OpenAI chat messages) with the model's chat template,
    samples a reply and returns it parsed (content, OpenAI-shaped ``tool_calls``, finish reason, and
    ``call_index``, the call's index in the session, for process rewards). ``sampling`` defaults to the run's."""

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                   sampling: SamplingParams | None = None) -> Reply: ...


@dataclass
class AgentResult:
    """How a session went, as the agent tells it."""

    reply: str                                                          # the final answer, for the verifier
    process_rewards: dict[int, float] = field(default_factory=dict)    # call index -> reward
    metrics: dict[str, float] = field(default_factory=dict)            # recorded with the session
    context_rewrites: int = 0                                          # times the agent rewrote its history


class Agent(abc.ABC):
    """A white-box agent. Forge calls the class with no arguments once per session, then awaits ``run``; an
    exception fails that session with its message. A task is the task file's line (see docs/agents.md)."""

    @abc.abstractmethod
    async def run(self, task: dict[str, Any], llm: LLM) -> AgentResult:
        """Play the session and return its result."""

    @classmethod  # noqa: B027 - nothing kept across sessions by default
    async def end_run(cls) -> None:
        """Called once when the run's rollouts end: release what the class keeps across sessions."""
