"""pydantic-ai with a structured output type (its default tool output: a forced tool call)."""

import sys

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior


class Owner(BaseModel):
    name: str


agent = Agent("openai:gpt-4o-mini", output_type=Owner, model_settings={"max_tokens": 48})
try:
    print(agent.run_sync(sys.stdin.read()).output)
except UnexpectedModelBehavior as exc:      # the model's arguments did not validate, retries included
    print(f"gave up: {exc}")
