"""smolagents' ToolCallingAgent at its defaults (it forces tool calls: tool_choice "required")."""

import os
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def lookup(key: str) -> str:
    """Look a key up in the table.

    Args:
        key: the key to look up.
    """
    return f"{key} is owned by Mai."


model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=os.environ["OPENAI_BASE_URL"],
                          api_key=os.environ["OPENAI_API_KEY"], max_tokens=48)
agent = ToolCallingAgent(tools=[lookup], model=model, max_steps=2, verbosity_level=0)
print(agent.run(sys.stdin.read()))
