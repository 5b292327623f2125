"""What the gateway keeps of its answers for the requests that refer back to them: the arguments of each tool call
exactly as the model wrote them (Anthropic's clients send a call back as a parsed object, and re-serialising it
could change the text: key order, spacing, escapes; with the model's own text the history splices token for token),
and the conversation behind each Responses API answer (``previous_response_id``). Both are bounded: the oldest
entries go first."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_TOOL_CALLS = 100_000
MAX_RESPONSES = 10_000


@dataclass(frozen=True)
class StoredResponse:
    session_id: str | None
    messages: list[dict]            # the conversation, the answer included, without the request's instructions


class Conversations:
    def __init__(self, max_tool_calls: int = MAX_TOOL_CALLS, max_responses: int = MAX_RESPONSES) -> None:
        self._arguments: OrderedDict[str, str] = OrderedDict()
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self.max_tool_calls = max_tool_calls
        self.max_responses = max_responses

    def keep_arguments(self, call_id: str, arguments: str) -> None:
        _put(self._arguments, call_id, arguments, self.max_tool_calls)

    def arguments_text(self, call_id: str, arguments: Any) -> str:
        """The text of a tool call's ``arguments`` (an object, as a client sent it back): as the model wrote them
        where this gateway answered the call and the object is what they say, else JSON of the object."""
        written = self._arguments.get(call_id)
        if written is not None:
            try:
                if json.loads(written) == arguments:
                    return written
            except ValueError:
                pass
        return json.dumps(arguments, ensure_ascii=False)

    def keep_response(self, response_id: str, stored: StoredResponse) -> None:
        _put(self._responses, response_id, stored, self.max_responses)

    def response(self, response_id: str) -> StoredResponse | None:
        return self._responses.get(response_id)


def _put(table: OrderedDict, key: str, value: Any, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)
