"""Reading a request body into memory with one copy of each byte.

aiohttp's ``Request.read`` grows one ``bytearray`` chunk by chunk; each growth of a buffer of many MiB may copy it
whole, and all of that runs on the event loop. Here a body with a ``Content-Length`` goes straight into a buffer of
that size, and one without is joined once from its chunks."""

from __future__ import annotations

from aiohttp import web

from forge.gateway.errors import BadRequest, TooLarge


def _too_large(limit: int) -> TooLarge:
    return TooLarge(f"the request body exceeds {limit} bytes")


async def read_body(request: web.Request, limit: int) -> bytes | bytearray:
    """The whole body of ``request``, refused with TooLarge once it passes ``limit`` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(limit)
    stream = request.content
    if declared is not None:
        buffer = bytearray(declared)
        view, filled = memoryview(buffer), 0
        while chunk := await stream.readany():
            end = filled + len(chunk)
            if end > declared:              # the HTTP parser stops at Content-Length; this is only a guard
                raise BadRequest(f"the request body is longer than its Content-Length ({declared} bytes)")
            view[filled:end] = chunk
            filled = end
        if filled != declared:
            raise BadRequest(f"the request body ended after {filled} of its {declared} bytes")
        return buffer
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.readany():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)
