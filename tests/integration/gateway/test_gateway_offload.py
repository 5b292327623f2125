"""Where the gateway does its work on large inputs: small ones on the loop, large ones in a thread, the largest in a
separate process at a lower CPU priority, whose refusals arrive intact and whose death fails one call only."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
from pathlib import Path

import httpx
import pytest

from forge.gateway.errors import BadRequest, ModelNotServed, TooLarge, Unavailable
from forge.gateway.http.decode import decode_json, prepare_call
from forge.gateway.off_loop import PROCESS_SIZE as OFFLOAD_SIZE
from forge.gateway.off_loop import OffLoop
from forge.gateway.prompt_limits import PromptLimits

from helpers.gateway_procs import random_actor, start_gateway

PROCESS_SIZE = 1000
LIMITS = PromptLimits(context_length=64, chars_per_token=4)


def padded(value: object, size: int = 2 * PROCESS_SIZE) -> bytes:
    """``value`` as JSON, padded with whitespace to ``size`` bytes (still the same value)."""
    raw = json.dumps(value).encode()
    return raw + b" " * (size - len(raw))


@pytest.fixture
def work():
    offload = OffLoop(process_size=PROCESS_SIZE)
    yield offload
    offload.close()


def test_only_the_largest_inputs_run_in_a_separate_process_at_a_lower_priority(work):
    async def scenario() -> tuple[int, int, int, int]:
        return (await work.run_isolated(10, os.getpid), await work.run_isolated(PROCESS_SIZE, os.getpid),
                await work.run_isolated(PROCESS_SIZE + 1, os.getpid), await work.run_isolated(PROCESS_SIZE + 1,
                                                                                              os.nice, 0))

    inline, threaded, isolated, niceness = asyncio.run(scenario())
    assert inline == threaded == os.getpid() != isolated
    assert niceness == min(19, os.nice(0) + work.niceness)


def test_a_body_whose_decoding_passes_the_memory_limit_fails_alone():
    """The decoding process runs under a memory limit: a body whose values take more fails that request with a
    413, and the same process decodes the next one."""
    work = OffLoop(process_size=PROCESS_SIZE, memory_bytes=64 << 20, preload=("forge.gateway.http.decode",))
    try:
        many = b"[" + b"{}," * 2_000_000 + b"{}]"           # 6 MB of JSON, about 130 MB of Python objects

        async def scenario() -> tuple[int, object]:
            first = await work.run_isolated(PROCESS_SIZE + 1, os.getpid)
            with pytest.raises(TooLarge, match="64 MiB"):
                await work.run_isolated(len(many), decode_json, many)
            assert await work.run_isolated(PROCESS_SIZE + 1, os.getpid) == first
            return first, await work.run_isolated(2 * PROCESS_SIZE, decode_json, padded({"a": [1, 2]}))

        pid, value = asyncio.run(scenario())
        assert pid != os.getpid() and value == {"a": [1, 2]}
    finally:
        work.close()


def test_a_body_decoded_apart_gives_the_same_values_and_refusals_as_inline(work):
    message = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.5}
    cases = {
        "fits": padded(message),
        "not json": padded(message)[:-1] + b"x",
        "surrogate": padded({**message, "messages": [{"role": "user", "content": "\ud800"}]}),
        "unknown model": padded({**message, "model": "other"}),
        "too long": padded({**message, "messages": [{"role": "user", "content": "x" * 300}]}),
    }

    async def both(raw: bytes) -> list[object]:
        outcomes: list[object] = []
        for size in (len(raw), 0):                  # in the process, then on the loop
            try:
                call, options = await work.run_isolated(size, prepare_call, raw, frozenset({"m"}), 100, LIMITS)
                outcomes.append((call.messages, call.sampling.max_tokens, call.sampling.temperature, options))
            except (BadRequest, ModelNotServed) as exc:
                outcomes.append((type(exc), exc.message, exc.param, exc.code))
        return outcomes

    for name, raw in cases.items():
        apart, inline = asyncio.run(both(raw))
        assert apart == inline, name
    assert asyncio.run(both(cases["surrogate"]))[0][2] == "messages[0].content"
    assert asyncio.run(both(cases["too long"]))[0][3] == "context_length_exceeded"
    assert asyncio.run(work.run_isolated(2 * PROCESS_SIZE, decode_json, padded([1, {"a": None}]))) == [1, {"a": None}]


def test_a_dead_decoding_process_fails_one_call_and_the_next_gets_a_new_one(work):
    async def scenario() -> tuple[int, int]:
        first = await work.run_isolated(PROCESS_SIZE + 1, os.getpid)
        with pytest.raises(Unavailable, match="decoding process died"):
            await work.run_isolated(PROCESS_SIZE + 1, os._exit, 9)
        return first, await work.run_isolated(PROCESS_SIZE + 1, os.getpid)

    first, second = asyncio.run(scenario())
    assert first != second and os.getpid() not in (first, second)


def test_a_closed_offload_refuses_new_isolated_work():
    work = OffLoop(process_size=PROCESS_SIZE)
    work.close()
    with pytest.raises(Unavailable, match="shutting down"):
        asyncio.run(work.run_isolated(PROCESS_SIZE + 1, os.getpid))


def test_a_killed_gateway_leaves_no_decoding_process_behind(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    actor = random_actor(directory)
    gateway = start_gateway(directory, [actor.address], directory / "pool")
    try:
        large = padded({"model": "other", "messages": [{"role": "user", "content": "hi"}]}, 2 * OFFLOAD_SIZE)
        response = httpx.post(f"{gateway.http}/v1/chat/completions", content=large, timeout=120,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
        pid = gateway.proc.pid
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
        handles = [os.pidfd_open(child) for child in children]
        assert handles, "the large body was not decoded in a child process"
        os.kill(pid, signal.SIGKILL)
        gateway.proc.wait(timeout=60)
        for handle in handles:                      # readable once the process has exited
            assert select.select([handle], [], [], 60)[0] == [handle]
            os.close(handle)
    finally:
        gateway.stop()
        actor.stop()
