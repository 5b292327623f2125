"""A tool-using agent written with nothing but the OpenAI client. It finds the colors of objects with a `lookup`
tool over several turns and prints its final answer. It knows nothing of Forge: it talks to whatever
OPENAI_BASE_URL and OPENAI_API_KEY name, reads its task (the conversation, the tool schema and the tool's data) from
the JSON file FORGE_TASK_FILE names, and prints its answer on standard output.
"""

import json
import os
import sys

from openai import OpenAI

MODEL = "forge-tiny"
MAX_TURNS = 6


def lookup(call, values: dict[str, str]) -> str:
    try:
        key = json.loads(call.function.arguments or "{}")["key"]
    except (ValueError, KeyError, TypeError):
        return "error: arguments must be a JSON object with a key"
    if call.function.name != "lookup":
        return f"error: unknown tool {call.function.name!r}"
    return values.get(key, f"error: unknown key {key!r}")


def main() -> None:
    with open(os.environ["FORGE_TASK_FILE"]) as file:
        task = json.load(file)
    client = OpenAI()
    messages = list(task["messages"])
    for _ in range(MAX_TURNS):
        tools = {"tools": task["tools"]} if task.get("tools") else {}
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=96, temperature=1.0,
                                               **tools)
        message = reply.choices[0].message
        if not message.tool_calls:
            print(message.content or "")
            return
        messages.append({"role": "assistant", "content": message.content or "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": lookup(c, task.get("values", {}))}
                     for c in message.tool_calls]
    print("no answer after the turn limit", file=sys.stderr)


if __name__ == "__main__":
    main()
