"""The reaper: a parent killed with ``kill -9`` leaves no adopted child running (and only those are ended); a parent
that closes its reaper leaves its children alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from forge.reaper import start_time

from helpers.processes import wait_gone

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the reaper reads Linux's /proc")

PARENT = """
import subprocess, sys, time
from forge.reaper import Reaper

def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

reaper = Reaper(grace_s=float(sys.argv[1]))
before = sleeper()                  # started before adopting: not the reaper's
reaper.adopt()
adopted = [sleeper(), sleeper()]
reaper.settle()
after = sleeper()                   # started after settling: not the reaper's
if sys.argv[2] == "close":
    reaper.close()
print(before.pid, *(p.pid for p in adopted), after.pid, reaper.process.pid, flush=True)
time.sleep(600)
"""


def start_parent(mode: str, grace_s: float = 5.0) -> tuple[subprocess.Popen, list[int]]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(grace_s), mode], stdout=subprocess.PIPE, text=True)
    return parent, [int(pid) for pid in parent.stdout.readline().split()]


def end(pids: list[int]) -> None:
    for pid in pids:
        if start_time(pid) is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_killed_parents_adopted_children_are_ended_and_no_others():
    parent, (before, first, second, after, reaper) = start_parent("keep")
    try:
        assert all(start_time(pid) is not None for pid in (before, first, second, after, reaper))
        parent.kill()
        parent.wait()
        wait_gone([first, second, reaper])
        assert start_time(before) is not None and start_time(after) is not None
    finally:
        end([before, first, second, after, reaper])
        parent.stdout.close()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period():
    script = PARENT.replace('"import time; time.sleep(600)"',
                            '"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"')
    parent = subprocess.Popen([sys.executable, "-c", script, "0.5", "keep"], stdout=subprocess.PIPE, text=True)
    before, first, second, after, reaper = (int(pid) for pid in parent.stdout.readline().split())
    try:
        parent.kill()
        parent.wait()
        wait_gone([first, second, reaper])
    finally:
        end([before, first, second, after, reaper])
        parent.stdout.close()


def test_a_parent_that_closes_its_reaper_keeps_its_children():
    parent, (before, first, second, after, reaper) = start_parent("close")
    try:
        wait_gone([reaper])                          # close() waits for it: gone already
        parent.kill()
        parent.wait()
        assert all(start_time(pid) is not None for pid in (before, first, second, after))
    finally:
        end([before, first, second, after, reaper])
        parent.stdout.close()


def wait_for_zombie(pid: int) -> None:
    """Until process ``pid`` has ended (its exit status not collected: ``start_time`` says None)."""
    deadline = time.monotonic() + 120
    while start_time(pid) is not None:
        assert time.monotonic() < deadline, f"process {pid} did not end"
        time.sleep(0.01)


def test_commands_written_just_before_the_parent_died_still_count():
    """A parent killed right after it settled may die before its reaper has read a word: the reaper reads what the
    parent wrote before it reaps, so the child it adopted is ended. (Here the reaper starts after the parent's death,
    its adopt and settle waiting in the pipe.)"""
    from forge.reaper import serve

    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    read, write = os.pipe()
    try:
        os.write(write, f"adopt\nsettle {child.pid}\n".encode())
        parent.kill()                       # not waited for: a zombie, still there for the reaper's pidfd
        wait_for_zombie(parent.pid)
        serve(parent.pid, 0.5, commands=read)
        wait_gone([child.pid])
    finally:
        os.close(read)
        os.close(write)
        for process in (parent, child):
            process.kill()
            process.wait()
