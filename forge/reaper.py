"""Ends what a killed process leaves behind: the child processes it started while the reaper was adopting them.

A process that embeds another engine (vLLM's ``AsyncLLM``) has children of its own making, vLLM's engine core and
its workers, which hold their memory (on a GPU, the device's) and outlive a ``kill -9`` of their parent: nothing
in them watches it. A restarted actor then finds the GPU taken. The reaper is a small process beside the parent,
in a session of its own (a terminal's Ctrl-C does not reach it), linked by a pipe only the parent writes to:

- ``adopt()``: from now on every new child of the parent is recorded, with its start time so that a reused pid is
  never mistaken for it (the reaper polls the parent's children, so a parent killed mid-start is covered);
- ``settle()``: stop adopting; the children the parent started since ``adopt()``, as it lists them itself, are the
  reaper's, however soon they came (what the parent starts later is not);
- ``close()``: the parent ended its children itself; the reaper exits and kills nothing.

If the parent dies without ``close()``, each adopted child still running is sent SIGTERM and, after ``grace_s``,
SIGKILL. Linux only (``/proc``); elsewhere nothing is adopted.

Why a process and not the parent-death signal (``PR_SET_PDEATHSIG``): it must be set inside each child, and vLLM
starts its engine core (fork or spawn, its choice) without a hook for that; the reaper needs nothing from them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.2
GRACE_S = 10.0


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid``, whichever of its threads started them (Linux /proc; empty elsewhere
    or once it is gone)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return found


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when it is gone or a zombie (ended, its exit
    status not yet collected)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()                  # after the name, which may hold spaces
    return None if fields[0] == "Z" else int(fields[19])    # state, start time (fields 3 and 22)


class Reaper:
    """The parent's end of a reaper process (see the module's docstring)."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        read, self._write = os.pipe()
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "forge.reaper", str(os.getpid()), str(grace_s)],
                                            stdin=read, start_new_session=True)
        finally:
            os.close(read)

    def adopt(self) -> None:
        """From now on, adopt the children this process starts."""
        self._send(b"adopt", self._children())

    def settle(self) -> None:
        """Stop adopting; the children started since ``adopt`` (all of them, however soon) are the reaper's."""
        self._send(b"settle", self._children())

    def _children(self) -> list[int]:
        return [pid for pid in child_pids(os.getpid()) if pid != self.process.pid]

    def close(self) -> None:
        """The parent ended its children itself: the reaper exits without killing anything."""
        if self._write < 0:
            return
        if self.process.poll() is None:
            self._send(b"done")
        os.close(self._write)
        self._write = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    def _send(self, command: bytes, pids: Sequence[int] = ()) -> None:
        """One line: the command and the parent's children as it sees them now (the reaper may read it later)."""
        try:
            os.write(self._write, b" ".join([command, *(str(pid).encode() for pid in pids)]) + b"\n")
        except BrokenPipeError:
            log.warning("the reaper (pid %d) is gone: this process's children would outlive a kill -9 of it",
                        self.process.pid)


def _reap(adopted: dict[int, int], grace_s: float) -> None:
    alive = {pid: started for pid, started in adopted.items() if start_time(pid) == started}
    if not alive:
        return
    log.warning("the parent died; ending the %d process(es) it left: %s", len(alive), sorted(alive))
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = {pid: started for pid, started in alive.items() if start_time(pid) == started}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def serve(parent: int, grace_s: float, commands: int = 0) -> None:
    """The reaper's loop: commands from the parent on file descriptor ``commands``. The parent's death is watched
    on a pidfd, not on the pipe: a child forked by the parent holds the pipe's write end too, so it would never
    close while that child runs."""
    me, parent_started = os.getpid(), start_time(parent)
    try:
        watch = [os.pidfd_open(parent)]
    except (AttributeError, OSError):          # no pidfd (old kernel): the parent's start time is polled instead
        watch = []
    adopting, baseline, adopted = False, set[int](), dict[int, int]()
    pending = b""

    def adopt_new(children: list[int]) -> None:
        for pid in set(children) - baseline - {me} - adopted.keys():
            started = start_time(pid)
            if started is not None:
                adopted[pid] = started

    while True:
        ready, _, _ = select.select([commands, *watch], [], [], POLL_S)
        if adopting and commands not in ready:
            seen = child_pids(parent)
            # The parent starts what is not the reaper's only after it has written "settle": children seen while
            # no command waits were all started before it, and once one waits, its own list is the one that counts.
            if not select.select([commands], [], [], 0)[0]:
                adopt_new(seen)
        gone = watch[0] in ready if watch else start_time(parent) != parent_started
        if not gone and commands not in ready:
            continue
        # Alive, one read a turn; dead, every command it wrote before it died (a parent killed right after settling
        # may die before the reaper has read a word), then reap.
        closed = False
        while select.select([commands], [], [], 0)[0]:
            chunk = os.read(commands, 4096)
            closed = not chunk                  # every writer closed the pipe
            pending += chunk
            if closed or not gone:
                break
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            command, *pids = line.split()
            children = [int(pid) for pid in pids]
            if command == b"adopt":
                baseline, adopting = set(children), True
            elif command == b"settle" and adopting:
                adopt_new(children)     # as the parent saw them when it settled
                adopting = False
            elif command == b"done":
                return
        if gone or closed:
            _reap(adopted, grace_s)
            return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s forge-reaper %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(int(sys.argv[1]), float(sys.argv[2]))
