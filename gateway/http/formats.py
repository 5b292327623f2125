"""The one place that lists the wire formats of model calls and the paths they are served at (under ``/`` and under
a session's ``/s/{session_id}/``)."""

from __future__ import annotations

from forge.gateway.http.anthropic import Messages
from forge.gateway.http.openai import ChatCompletions
from forge.gateway.http.responses import Responses
from forge.gateway.http.wire import WireFormat

WIRE_PATHS: dict[str, WireFormat] = {
    "/v1/chat/completions": ChatCompletions(),
    "/v1/messages": Messages(),
    "/v1/responses": Responses(),
}
WIRE_FORMATS: dict[str, WireFormat] = {wire.name: wire for wire in WIRE_PATHS.values()}
