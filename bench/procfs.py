"""What the benchmarks read of a process from /proc (Linux): its CPU seconds, its child processes, its memory."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (e.g. the gateway's body-decoding process)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def memory_kib(pid: int) -> dict[str, int]:
    """Peak and current resident memory and the anonymous part of it (the heap, a mapped file's pages apart), KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(fields[key].split()[0]) for name, key in (("peak", "VmHWM"), ("now", "VmRSS"),
                                                                  ("anonymous", "RssAnon"))}
