"""Reading the events of a request's answers: the last one (the recorded result) of a call, and the events of
several calls to one prompt (``n`` answers) as one stream of (answer index, event) pairs, in the order they come."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from forge.gateway.calls import ChatResult

_ENDED = object()


async def final_result(events: AsyncIterator[Any]) -> ChatResult:
    """The recorded result that ends a call's events."""
    result: ChatResult | None = None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, ChatResult):
                result = event
    if result is None:
        raise RuntimeError("a call's events ended without its result")
    return result


async def all_results(streams: list[AsyncIterator[Any]]) -> list[ChatResult]:
    """Every call's result; the first failure cancels the others and is raised."""
    if len(streams) == 1:
        return [await final_result(streams[0])]
    tasks = [asyncio.ensure_future(final_result(events)) for events in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def indexed(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Every call's events as (index of its call, event), as they come; a call's failure ends the stream with it
    and cancels the other calls."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as events:
            async for event in events:
                yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, events: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    await queue.put((index, event))
            await queue.put((index, _ENDED))
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, events)) for i, events in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, item = await queue.get()
            if item is _ENDED:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
