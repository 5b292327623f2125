"""litellm's completion (the OpenAI provider, at the base URL): a tool loop of two calls."""

import json
import os
import sys

import litellm

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up in the table.",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                          "required": ["key"]}}}]
messages = [{"role": "user", "content": sys.stdin.read()}]
for _ in range(2):
    reply = litellm.completion(model="openai/gpt-4o-mini", api_base=os.environ["OPENAI_BASE_URL"],
                               api_key=os.environ["OPENAI_API_KEY"], messages=messages, tools=TOOLS, max_tokens=48)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        key = json.loads(call.function.arguments or "{}").get("key", "")
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{key} is owned by Mai."})
print(messages[-1].get("content"))
