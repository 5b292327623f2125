"""A white-box agent for the colors tasks: it looks colors up with the task's `lookup` tool and manages its own
context. Once its history holds more than two tool results it rewrites it, keeping the task and a note of the
colors found instead of the whole exchange (as the built-in model was taught to); each call is its own training sample, so the rewrite costs nothing in correctness.
A malformed tool call earns a process reward of -0.5 on that call."""

import json

from forge.agents import LLM, Agent, AgentResult

MAX_TURNS = 6
KEEP_TOOL_RESULTS = 2      # beyond this many tool results the history is rewritten into a note
FORMAT_HINT = 'Malformed tool call. Use <tool_call>{"name": "lookup", "arguments": {"key": KEY}}</tool_call>.'


class ColorAgent(Agent):
    async def run(self, task: dict, llm: LLM) -> AgentResult:
        messages = list(task["messages"])
        found: dict[str, str] = {}
        result = AgentResult(reply="")
        for _ in range(MAX_TURNS):
            reply = await llm.chat(messages, task["tools"])
            if reply.tool_calls:
                messages.append(reply.message())
                for call in reply.tool_calls:
                    text, key = self.lookup(call, task["values"])
                    if key is not None:
                        found[key] = text
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
                if sum(m["role"] == "tool" for m in messages) > KEEP_TOOL_RESULTS:
                    note = ", ".join(f"{k}={v}" for k, v in found.items())
                    messages = [*task["messages"], {"role": "user", "content": f"Known: {note}."}]
                    result.context_rewrites += 1
                continue
            if reply.malformed_tool_call:
                result.process_rewards[reply.call_index] = -0.5
                messages += [reply.message(), {"role": "user", "content": FORMAT_HINT}]
                continue
            result.reply = reply.content
            break
        return result

    @staticmethod
    def lookup(call: dict, values: dict[str, str]) -> tuple[str, str | None]:
        try:
            key = json.loads(call["function"]["arguments"] or "{}")["key"]
        except (ValueError, KeyError, TypeError):
            return "error: arguments must be a JSON object with a key", None
        if key not in values:
            return f"error: unknown key {key!r}", None
        return values[key], key
