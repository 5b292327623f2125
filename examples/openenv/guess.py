"""An OpenEnv environment (openenv-core) as any OpenEnv user writes one: guess a number from 1 to 50 in six tries,
told "higher" or "lower" after each. Forge serves it on loopback and plays it unchanged (see run.toml); so can TRL
or any OpenEnv client, from ``uvicorn guess:app``."""

from __future__ import annotations

import random
import re
from typing import Any
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

TRIES = 6


class Guess(Action):
    text: str = Field(..., description="The player's reply; its last number is the guess")


class Hint(Observation):
    message: str = ""


class GuessState(State):
    secret: int = 0


class GuessEnvironment(Environment[Guess, Hint, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState(episode_id=str(uuid4()))

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Hint:
        self._state = GuessState(episode_id=episode_id or str(uuid4()), secret=random.Random(seed).randint(1, 50))
        return Hint(message=f"I am thinking of a number from 1 to 50. You have {TRIES} tries: reply with a number.")

    def step(self, action: Guess, timeout_s: float | None = None, **kwargs: Any) -> Hint:
        self._state.step_count += 1
        numbers = re.findall(r"\d+", action.text)
        guess = int(numbers[-1]) if numbers else None
        if guess == self._state.secret:
            return Hint(message="Correct!", reward=1.0, done=True)
        done = self._state.step_count >= TRIES
        hint = "That is not a number." if guess is None else ("Higher." if guess < self._state.secret else "Lower.")
        return Hint(message=hint + (f" The number was {self._state.secret}." if done else ""), reward=0.0, done=done)

    @property
    def state(self) -> GuessState:
        return self._state


app = create_fastapi_app(GuessEnvironment, Guess, Hint, max_concurrent_envs=64)
