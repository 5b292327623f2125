"""openai-agents with a structured output type beside a tool (chat-completions model): its default strict JSON
schema as response_format, so every reply is a document of Owner or a call of the tool."""

import asyncio
import sys

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from openai import AsyncOpenAI
from pydantic import BaseModel


class Owner(BaseModel):
    name: str
    sure: bool


@function_tool
def lookup(key: str) -> str:
    """Look a key up in the table."""
    return f"{key} is owned by Mai."


async def main() -> None:
    set_tracing_disabled(True)      # traces would go to OpenAI's servers, out of reach here
    model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=AsyncOpenAI())
    agent = Agent(name="clerk", instructions="Answer with the table's help.", tools=[lookup], model=model,
                  output_type=Owner, model_settings=ModelSettings(max_tokens=48))
    try:
        result = await Runner.run(agent, sys.stdin.read(), max_turns=3)
        print(result.final_output)
    except (MaxTurnsExceeded, ModelBehaviorError) as exc:
        print(f"gave up: {type(exc).__name__}")


asyncio.run(main())
