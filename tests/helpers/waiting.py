"""Waiting for an event: poll a condition until it holds. The bound is a guard against a hang, never what a test
measures: it is generous whatever the machine's load, and running out of it fails the test, naming what was
awaited."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest

from forge.launch import ServiceProcess

WAIT_S = 120.0              # the most any awaited event may take (it normally takes a fraction of a second)

T = TypeVar("T")


def wait_for(condition: Callable[[], T], what: str, timeout_s: float = WAIT_S, *,
             watched: Iterable[ServiceProcess | subprocess.Popen] = (), interval_s: float = 0.05) -> T:
    """Poll ``condition`` every ``interval_s`` until it returns a true value, and return that value. Fail, naming
    ``what``, once ``timeout_s`` has run out, or as soon as a process of ``watched`` has exited (with the end of its
    log, or of its output for a Popen whose stdout is a pipe)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        for process in watched:
            proc = process.proc if isinstance(process, ServiceProcess) else process
            if proc.poll() is not None:
                pytest.fail(f"{_name(process)} exited ({proc.returncode}) while waiting for {what}:\n"
                            f"{_output(process)[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what} (not within {timeout_s:.0f} s)")
        time.sleep(interval_s)


def _name(process: ServiceProcess | subprocess.Popen) -> str:
    return process.name if isinstance(process, ServiceProcess) else str(process.args[0])


def _output(process: ServiceProcess | subprocess.Popen) -> str:
    """What an exited process wrote."""
    if isinstance(process, ServiceProcess):
        return process.log_text()
    return process.stdout.read() if process.stdout else ""


async def wait_for_async(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S, *,
                         interval_s: float = 0.02) -> None:
    """``wait_for`` inside an event loop: the loop keeps running between polls."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what} (not within {timeout_s:.0f} s)")
        await asyncio.sleep(interval_s)
