"""A tool-using agent written with nothing but Anthropic's client, as agents of the Claude Code family are: it finds
the colors of objects with a `lookup` tool over several turns and prints its final answer. It knows nothing of
Forge: it talks to whatever ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY name, and reads its task (the conversation,
the tool schema and the tool's data) from the JSON file FORGE_TASK_FILE names.
"""

import json
import os
import sys

import anthropic

MODEL = "claude-sonnet-4-5"         # the gateway serves the model being trained whatever this says
MAX_TURNS = 6


def tools_of(task: dict) -> list[dict]:
    """The task's OpenAI-style function tools as Anthropic client tools."""
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"].get("parameters", {"type": "object"})} for t in task.get("tools", [])]


def lookup(use, values: dict[str, str]) -> str:
    if use.name != "lookup":
        return f"error: unknown tool {use.name!r}"
    key = use.input.get("key") if isinstance(use.input, dict) else None
    return values.get(key, f"error: unknown key {key!r}")


def main() -> None:
    with open(os.environ["FORGE_TASK_FILE"]) as file:
        task = json.load(file)
    client = anthropic.Anthropic()
    messages = [{"role": m["role"], "content": m["content"]} for m in task["messages"]]
    for _ in range(MAX_TURNS):
        reply = client.messages.create(model=MODEL, max_tokens=96, tools=tools_of(task), messages=messages)
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            print("".join(block.text for block in reply.content if block.type == "text"))
            return
        messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True)
                                                          for block in reply.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": lookup(use, task.get("values", {}))}
            for use in uses]})
    print("no answer after the turn limit", file=sys.stderr)


if __name__ == "__main__":
    main()
