"""openai-agents at its defaults: its default model path (the Responses API), a function tool, a few turns."""

import sys

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError


@function_tool
def lookup(key: str) -> str:
    """Look a key up in the table."""
    return f"{key} is owned by Mai."


set_tracing_disabled(True)          # traces would go to OpenAI's servers, out of reach here
agent = Agent(name="clerk", instructions="Answer with the table's help.", tools=[lookup], model="gpt-4o-mini",
              model_settings=ModelSettings(max_tokens=48, temperature=1.0))
try:
    result = Runner.run_sync(agent, sys.stdin.read(), max_turns=3)
    print(result.final_output)
except (MaxTurnsExceeded, ModelBehaviorError) as exc:     # the model's doing, not the gateway's
    print(f"gave up: {type(exc).__name__}")
