"""What the actors and their callers agree a ``GenerateRequest.stream_interval`` means beyond the proto's words (tokens
a chunk after the first, 0 for the actor's own setting): the interval no request reaches, which asks for the first
token alone and then the rest of the answer in one message."""

from __future__ import annotations

WHOLE_ANSWER = 2**31 - 1
