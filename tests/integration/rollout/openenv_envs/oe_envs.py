"""OpenEnv environments over local data, written against openenv-core alone: a text question (the reply is the
action) and an MCP environment whose tools are a calculator and ``submit``. ``qa_app`` and ``calc_app`` are them as
their own servers would run them (``uvicorn oe_envs:calc_app``)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server import (
    Action,
    CallToolAction,
    CallToolObservation,
    Environment,
    MCPEnvironment,
    Observation,
    State,
    create_fastapi_app,
)
from pydantic import Field

QUESTIONS = [("What is 2 + 3?", "5"), ("What is the capital of France?", "paris"), ("What colour is the sky?", "blue"),
             ("How many legs has a spider?", "8")]


class Reply(Action):
    text: str = Field(..., description="The model's reply")


class Question(Observation):
    question: str = ""
    feedback: str = ""


class QAState(State):
    answer: str = ""


class QAEnvironment(Environment[Reply, Question, QAState]):
    """reset(seed) asks a question; a reply scores 1.0 when it holds the answer; two tries."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = QAState(episode_id=str(uuid4()))

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Question:
        question, answer = QUESTIONS[(seed or 0) % len(QUESTIONS)]
        self._state = QAState(episode_id=episode_id or str(uuid4()), answer=answer)
        return Question(question=question)

    def step(self, action: Reply, timeout_s: float | None = None, **kwargs: Any) -> Question:
        self._state.step_count += 1
        correct = self._state.answer in action.text.lower()
        done = correct or self._state.step_count >= 2
        return Question(question="" if done else "Try again.", feedback="correct" if correct else "wrong",
                        reward=1.0 if correct else 0.0, done=done)

    @property
    def state(self) -> QAState:
        return self._state


class CalcEnvironment(MCPEnvironment):
    """Tools: ``add`` and ``submit`` (which ends the episode, 1.0 when right)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        tools = FastMCP("calc")

        @tools.tool()
        def add(a: int, b: int) -> int:
            """Add two whole numbers."""
            return a + b

        super().__init__(tools)
        self._state = State(episode_id=str(uuid4()))
        self._answer = ""
        self._solved = False

        @self.tool()
        def submit(answer: str) -> str:
            """Submit the final answer."""
            self._solved = answer.strip() == self._answer
            return "correct" if self._solved else "wrong"

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        a, b = 10 + (seed or 0), 7
        self._answer = str(a + b)
        self._state = State(episode_id=episode_id or str(uuid4()))
        return CallToolObservation(tool_name="", result=f"What is {a} + {b}? Use add, then submit the answer.")

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        finished = isinstance(action, CallToolAction) and action.tool_name == "submit"
        observation.reward, observation.done = (1.0 if finished and self._solved else 0.0), finished
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


qa_app = create_fastapi_app(QAEnvironment, Reply, Question, max_concurrent_envs=8)
calc_app = create_fastapi_app(CalcEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=8)


class TwoFields(Action):
    text: str
    confidence: float


class TwoFieldEnvironment(QAEnvironment, Environment[TwoFields, Question, QAState]):
    """An action the model's reply alone cannot fill."""
