"""``RequestStream``, the handoff between a backend's thread and the server: every chunk arrives, in order, to a
threaded or an asyncio consumer, and the asyncio side wakes its loop once per burst rather than once per chunk."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from forge.actors.backend import FinishReason, RequestStream, TokenChunk, batched_wakeups


def chunks_for(index: int, count: int) -> list[TokenChunk]:
    body = [TokenChunk(token_ids=[index, n]) for n in range(count - 1)]
    return [*body, TokenChunk(token_ids=[index, count - 1], finish_reason=FinishReason.LENGTH)]


def produce(streams: list[RequestStream], per_stream: int, seed: int) -> None:
    """Engine-like: each step puts one chunk on every unfinished stream, with random pauses between steps."""
    rng = random.Random(seed)
    planned = {s.request_id: chunks_for(i, per_stream) for i, s in enumerate(streams)}
    for step in range(per_stream):
        for stream in streams:
            stream.put(planned[stream.request_id][step])
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.002)


def test_asyncio_consumers_get_every_chunk_in_order_across_threads():
    streams = [RequestStream(f"r{i}") for i in range(40)]

    async def consume(stream: RequestStream) -> list[list[int]]:
        return [chunk.token_ids async for chunk in stream]

    async def main() -> list[list[list[int]]]:
        consumers = [asyncio.ensure_future(consume(s)) for s in streams]
        await asyncio.sleep(0.01)                 # consumers first wait on empty streams
        producer = threading.Thread(target=produce, args=(streams, 60, 0))
        producer.start()
        received = await asyncio.wait_for(asyncio.gather(*consumers), timeout=60)
        producer.join()
        return received

    received = asyncio.run(main())
    assert received == [[[i, n] for n in range(60)] for i in range(len(streams))]
    assert all(s.finished.is_set() for s in streams)


def test_a_stream_read_to_its_end_yields_nothing_more_either_way():
    stream = RequestStream("r")
    for chunk in chunks_for(0, 3):
        stream.put(chunk)

    async def read() -> list[TokenChunk]:
        return [chunk async for chunk in stream]

    assert len(asyncio.run(read())) == 3
    assert asyncio.run(read()) == [] and list(stream) == []


def put_all(streams: list[RequestStream]) -> None:
    with batched_wakeups():
        for stream in streams:
            stream.put(TokenChunk(token_ids=[1]))
            time.sleep(0.002)           # the loop runs meanwhile: a wake-up not held back would reach it now


def test_the_wake_ups_of_a_batch_are_coalesced():
    """One step's chunks for 50 waiting streams, put inside ``batched_wakeups``, schedule one loop callback, however
    long the step takes between its puts."""
    streams = [RequestStream(f"r{i}") for i in range(50)]
    scheduled = 0

    async def main() -> None:
        nonlocal scheduled
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            nonlocal scheduled
            scheduled += getattr(callback, "__name__", "") == "_set_pending"      # not asyncio's own callbacks
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        consumers = [asyncio.ensure_future(_first(s)) for s in streams]
        await asyncio.sleep(0.01)
        burst = threading.Thread(target=put_all, args=(streams,))
        burst.start()
        await asyncio.wait_for(asyncio.gather(*consumers), timeout=30)
        burst.join()

        loop.call_soon_threadsafe = original

    asyncio.run(main())
    assert scheduled == 1


async def _first(stream: RequestStream) -> TokenChunk:
    async for chunk in stream:
        return chunk
    raise AssertionError("no chunk")
