"""An agent on the anthropic client (as in the Claude Code family): system prompt, a tool, streaming, a tool loop of
two calls."""

import sys

import anthropic

TOOLS = [{"name": "lookup", "description": "Look a key up in the table.",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}]
client = anthropic.Anthropic()      # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY
messages = [{"role": "user", "content": sys.stdin.read()}]
for _ in range(2):
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=48, system="Answer with the table's help.",
                                tools=TOOLS, messages=messages) as stream:
        reply = stream.get_final_message()
    messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]})
    uses = [block for block in reply.content if block.type == "tool_use"]
    if not uses:
        break
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": f"{use.input.get('key')} is owned by Mai."}
        for use in uses]})
print(next((b.text for b in reply.content if b.type == "text"), ""))
