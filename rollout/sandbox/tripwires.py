"""Escape attempts a sandboxed command made, as the kernel saw them: counts of its system calls that the sandbox's
walls refused, by kind.

- ``write``: EROFS from any call but an access check: a write, create, rename, link or attribute change aimed at the
  read-only tree around the workspace;
- ``network``: ENETUNREACH or EHOSTUNREACH: a connection or datagram aimed beyond the sandbox's loopback-only network;
- ``processes``: EAGAIN from fork, vfork, clone or clone3: a process past the sandbox's process limit;
- ``memory``: ENOMEM from mmap, mremap or brk: memory past the sandbox's address-space limit.

Each kind is a perf event on the kernel's syscall-exit tracepoint (``raw_syscalls:sys_exit``) with a filter the
kernel applies, opened on the sandbox namespace's init before it starts the command and inherited by everything
started under it; each child's count joins its parent's as it exits, so once the namespace is gone the counts are
final. Nothing is read from inside the sandbox, so nothing there can hide an attempt.

perf_event_open is called through ctypes: the standard library has no binding, and the PyPI ones are tied to
sampling or to BPF, not to counting a tracepoint. Counting needs the tracepoint's id (from tracefs: read in a private
mount namespace where the host has not mounted it) and the right to trace the sandbox's processes (root); where
either is missing, ``unavailable()`` says why and attempts are still refused, just not counted.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import struct
import subprocess
from collections.abc import Mapping

EROFS, EAGAIN, ENOMEM, ENETUNREACH, EHOSTUNREACH = 30, 11, 12, 101, 113
# What each kind is called in a session's failure, singular and plural.
KINDS = {"write": ("write outside its tree", "writes outside its tree"),
         "network": ("network connection", "network connections"),
         "processes": ("process past its limit", "processes past their limit"),
         "memory": ("allocation past its memory limit", "allocations past its memory limit")}
# Syscall numbers, by machine: perf_event_open itself, and those the filters name.
SYSCALLS = {
    "x86_64": {"perf_event_open": 298, "access": (21, 269, 439), "fork": (56, 57, 58, 435), "memory": (9, 12, 25)},
    "aarch64": {"perf_event_open": 241, "access": (48, 439), "fork": (220, 435), "memory": (222, 214, 216)},
}
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
SYS_EXIT = "events/raw_syscalls/sys_exit/id"
PERF_TYPE_TRACEPOINT = 2
ATTR_SIZE = 64                          # PERF_ATTR_SIZE_VER0: every field used here is in the first version
DISABLED, INHERIT = 1 << 0, 1 << 1
FD_CLOEXEC = 1 << 3                     # PERF_FLAG_FD_CLOEXEC
IOC_ENABLE, IOC_SET_FILTER = 0x2400, 0x40082406


log = logging.getLogger(__name__)


class TripwireError(OSError):
    """Attempts cannot be counted here (why: the message)."""


def _either(name: str, numbers: tuple[int, ...]) -> str:
    return "(" + " || ".join(f"{name} == {n}" for n in numbers) + ")"


def filters(machine: str) -> dict[str, str]:
    """Each kind's tracepoint filter on ``machine``."""
    calls = SYSCALLS[machine]
    return {"write": f"ret == -{EROFS} && !{_either('id', calls['access'])}",
            "network": f"(ret == -{ENETUNREACH} || ret == -{EHOSTUNREACH})",
            "processes": f"ret == -{EAGAIN} && {_either('id', calls['fork'])}",
            "memory": f"ret == -{ENOMEM} && {_either('id', calls['memory'])}"}


def _tracepoint_id() -> int:
    for root in TRACEFS:
        try:
            return int(open(os.path.join(root, SYS_EXIT)).read())
        except (OSError, ValueError):
            continue
    # Not mounted: mount tracefs where only a throwaway mount namespace sees it.
    try:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                               f"mount -t tracefs tracefs {TRACEFS[0]} && cat {TRACEFS[0]}/{SYS_EXIT}"],
                              capture_output=True, text=True, timeout=30)
        return int(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        raise TripwireError("the kernel's syscall-exit tracepoint is not readable (tracefs needs root)") from None


_libc = ctypes.CDLL(None, use_errno=True)


def _open_counter(event: int, pid: int, machine: str, text: str, inherit: bool = True) -> int:
    attr = bytearray(ATTR_SIZE)
    struct.pack_into("=IIQQQQQ", attr, 0, PERF_TYPE_TRACEPOINT, ATTR_SIZE, event, 0, 0, 0,
                     DISABLED | (INHERIT if inherit else 0))
    fd = _libc.syscall(SYSCALLS[machine]["perf_event_open"], (ctypes.c_char * ATTR_SIZE).from_buffer(attr),
                       pid, -1, -1, FD_CLOEXEC)
    if fd < 0:
        error = ctypes.get_errno()
        raise TripwireError(error, f"perf_event_open: {os.strerror(error)}")
    if _libc.ioctl(fd, IOC_SET_FILTER, ctypes.c_char_p(text.encode())) < 0 or _libc.ioctl(fd, IOC_ENABLE, 0) < 0:
        error = ctypes.get_errno()
        os.close(fd)
        raise TripwireError(error, f"a perf event's filter: {os.strerror(error)}")
    return fd


@functools.cache
def _setup() -> tuple[str, int] | str:
    """This machine's name and the tracepoint's id, or why counting cannot be had. The event it tries on this process
    stays open: the kernel hooks the tracepoint into every task's system calls when its first event opens and unhooks
    it when its last closes, tens of milliseconds each way, which each command would otherwise pay."""
    machine = platform.machine()
    if machine not in SYSCALLS:
        return f"no syscall table for {machine}"
    try:
        event = _tracepoint_id()
        _open_counter(event, os.getpid(), machine, filters(machine)["write"], inherit=False)
    except TripwireError as exc:
        return str(exc)
    return machine, event


def unavailable() -> str | None:
    """Why attempts cannot be counted on this host, or None when they can."""
    setup = _setup()
    return setup if isinstance(setup, str) else None


class Tripwires:
    """The counters on one namespace: open them before its init starts the command, read them after it is gone."""

    def __init__(self, pid: int) -> None:
        setup = _setup()
        if isinstance(setup, str):
            raise TripwireError(setup)
        machine, event = setup
        self._fds: dict[str, int] = {}
        try:
            for kind, text in filters(machine).items():
                self._fds[kind] = _open_counter(event, pid, machine, text)
        except BaseException:
            self.close()
            raise

    def counts(self) -> dict[str, int]:
        """The attempts of each kind made so far (kinds with none left out)."""
        counted = {kind: struct.unpack("=Q", os.read(fd, 8))[0] for kind, fd in self._fds.items()}
        return {kind: n for kind, n in counted.items() if n}

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


@functools.cache
def _say_unavailable(reason: str) -> None:
    log.warning("sandbox escape attempts are refused but not counted here: %s", reason)


def watch(pid: int) -> Tripwires | None:
    """Counters on the namespace whose init is ``pid``; None (said once in the log) where they cannot be had."""
    reason = unavailable()
    if reason is None:
        try:
            return Tripwires(pid)
        except TripwireError as exc:
            reason = str(exc)
    _say_unavailable(reason)
    return None


def describe(counts: Mapping[str, int]) -> str:
    """``counts`` in words: '2 writes outside its tree, 1 network connection'."""
    return ", ".join(f"{n} {KINDS[kind][n != 1]}" for kind, n in counts.items() if n)


__all__ = ["KINDS", "TripwireError", "Tripwires", "describe", "filters", "unavailable", "watch"]
