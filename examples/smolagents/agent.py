"""smolagents' ToolCallingAgent, unchanged and at its defaults (it forces a tool call at every step), on the
black-box example's tasks: a `lookup` tool over the task's data, and its final answer printed. It knows nothing of
Forge: it talks to whatever OPENAI_BASE_URL and OPENAI_API_KEY name and reads its task from FORGE_TASK_FILE.
"""

import json
import os
from typing import ClassVar

from smolagents import OpenAIServerModel, Tool, ToolCallingAgent


class Lookup(Tool):
    name = "lookup"
    description = "Color of a key."
    inputs: ClassVar[dict] = {"key": {"type": "string", "description": "the object whose color to look up"}}
    output_type = "string"

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__()
        self.values = values

    def forward(self, key: str) -> str:
        return self.values.get(key, f"error: unknown key {key!r}")


def main() -> None:
    with open(os.environ["FORGE_TASK_FILE"]) as file:
        task = json.load(file)
    model = OpenAIServerModel(model_id="forge-tiny", api_base=os.environ["OPENAI_BASE_URL"],
                              api_key=os.environ["OPENAI_API_KEY"], max_tokens=96)
    agent = ToolCallingAgent(tools=[Lookup(task.get("values", {}))], model=model, max_steps=4, verbosity_level=0)
    print(f"Answer: {agent.run(task['messages'][-1]['content'])}")


if __name__ == "__main__":
    main()
