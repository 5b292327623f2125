"""One session's sandbox: a private writable tree (its workspace, seeded from a task's files) in which commands run
isolated (``forge.rollout.sandbox.bwrap``) and limited: CPU seconds, address space, file size and processes per sandbox,
and a wall-clock timeout after which the command and everything it started are killed.

bwrap reports the command's status as soon as the command ends, while the kernel is still killing what it left in its
PID namespace; ``run`` returns only once the namespace's init is gone, which the kernel allows only after everything
else in the namespace is gone, so nothing a command started outlives ``run``.

Limits are resource limits set before bwrap starts (by util-linux's ``prlimit``, which then runs it) and inherited
by everything under it. The process limit counts per user: run as root, each sandbox's commands run as a user of
their own (``uid``, from the pool), so one sandbox's fork bomb meets its own limit and nobody else's; run as another
user, the limit is that user's current process count plus ``max_processes``, which concurrent sandboxes share.

What a command tried and the sandbox refused (a write outside its workspace, a network connection, a process or an
allocation past its limits) is counted by the kernel (``forge.rollout.sandbox.tripwires``): the namespace waits for the
counters before it starts the command (bwrap's ``--block-fd``). A command's attempts come back in its result and are
added to the sandbox's ledger (``attempts.jsonl``, outside the workspace), where the session's owner reads them
whichever process ran the command; a sandbox with any fails its session.

A sandbox is also a directory a black-box agent can be handed (``FORGE_SANDBOX``): ``sandbox.json`` there holds
what ``Sandbox.attach`` needs to run further commands in it (``forge sandbox exec DIR -- COMMAND``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forge.rollout.sandbox.bwrap import WORKSPACE, bwrap_argv, find_bwrap
from forge.rollout.sandbox.config import MIB, SandboxConfig
from forge.rollout.sandbox.tripwires import Tripwires, watch

DESCRIPTION = "sandbox.json"
LEDGER = "attempts.jsonl"
PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"      # `python`: the Python Forge runs in
BWRAP_PROCESSES = 2         # bwrap itself and the namespace's init
TEARDOWN_WARN_S = 60.0      # a namespace not torn down by then is reported (it is still waited for)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecResult:
    returncode: int             # the command's status (128 + N: killed by signal N, as a shell says); negative: the
                                # sandbox was killed (its timeout)
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    truncated: bool = False     # an output stream was longer than the sandbox keeps
    attempts: dict[str, int] = field(default_factory=dict)     # escape attempts by kind (forge.rollout.sandbox.tripwires)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class SandboxError(RuntimeError):
    """A sandbox cannot be made or used (bwrap missing, a bad directory)."""


def user_processes(uid: int) -> int:
    """Processes on this host whose owner is ``uid``."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                continue
    return count


def namespace_init(info: int) -> tuple[int, int] | None:
    """The host's pid of the namespace's init and a pidfd of it, from bwrap's info pipe (closed here); None when it
    is already gone or bwrap failed before making it. Opened as soon as bwrap starts it: bwrap, its parent, holds
    its pid until then."""
    with os.fdopen(info, "rb") as stream:
        text = stream.read()
    try:
        pid = int(json.loads(text)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        return pid, os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def release(block: int) -> None:
    """Let the namespace start its command (a byte on its block pipe, closed here)."""
    try:
        os.write(block, b"\0")
    except BrokenPipeError:             # bwrap failed before it waited: its status says why
        pass
    finally:
        os.close(block)


def wait_for_teardown(init: int) -> None:
    """Wait until the namespace's init (a pidfd, closed here) has exited: the kernel lets it exit only after
    everything else in its namespace is gone."""
    poller = select.poll()
    poller.register(init, select.POLLIN)
    try:
        if not poller.poll(TEARDOWN_WARN_S * 1000):
            log.warning("a sandbox's processes are still being torn down after %.0f s; waiting", TEARDOWN_WARN_S)
            poller.poll()
    finally:
        os.close(init)


class Sandbox:
    """Commands run in ``directory/workspace`` (``/workspace`` inside). ``uid``: the user they run as (root only;
    None: this process's). Use ``Sandbox.create`` for a new one, ``Sandbox.attach`` for one made elsewhere."""

    def __init__(self, directory: Path, config: SandboxConfig, uid: int | None = None) -> None:
        self.directory = Path(directory)
        self.config = config
        self.uid = uid
        self.bwrap = find_bwrap()
        self.prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"

    @property
    def workspace(self) -> Path:
        return self.directory / "workspace"

    @classmethod
    def create(cls, directory: Path, config: SandboxConfig, uid: int | None = None,
               seed: Path | None = None) -> Sandbox:
        """A sandbox in ``directory`` (made, or emptied), its workspace a copy of ``seed`` when given."""
        sandbox = cls(directory, config, uid)
        sandbox.reset(seed)
        return sandbox

    @classmethod
    def attach(cls, directory: str | Path) -> Sandbox:
        """The sandbox whose directory ``directory`` is (its description, written by ``reset``)."""
        directory = Path(directory)
        try:
            data = json.loads((directory / DESCRIPTION).read_text())
            config = SandboxConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SandboxError(f"{directory} is not a sandbox: {exc}") from None
        return cls(directory, config, data.get("uid"))

    def reset(self, seed: Path | None = None) -> None:
        """An empty workspace (a copy of ``seed``), owned by the sandbox's user, and its description written."""
        shutil.rmtree(self.workspace, ignore_errors=True)
        (self.directory / LEDGER).unlink(missing_ok=True)
        if seed is not None:
            shutil.copytree(seed, self.workspace, symlinks=True)
        else:
            self.workspace.mkdir(parents=True)
        if self.uid is not None:
            for root, dirs, files in os.walk(self.workspace):
                for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
                    os.lchown(name, self.uid, self.uid)
        (self.directory / DESCRIPTION).write_text(json.dumps(
            {"uid": self.uid, "config": {k: list(v) if isinstance(v, tuple) else v
                                         for k, v in asdict(self.config).items()}}))

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def limits(self) -> list[str]:
        """``prlimit`` and its limits, to run before bwrap (as the sandbox's user)."""
        config = self.config
        processes = config.max_processes + BWRAP_PROCESSES
        if self.uid is None:
            processes += user_processes(os.getuid())
        limits = {"cpu": config.cpu_seconds, "as": config.memory_mb * MIB, "fsize": config.max_file_mb * MIB,
                  "nproc": processes, "core": 0}
        return [self.prlimit, *(f"--{name}={value}:{value}" for name, value in limits.items()), "--"]

    def argv(self, command: Sequence[str] | str, env: Mapping[str, str] | None = None,
             cwd: str = WORKSPACE, info_fd: int | None = None, block_fd: int | None = None) -> list[str]:
        """The full command line (a string runs under ``sh -c``)."""
        words = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        environment = {"PATH": PATH, "HOME": WORKSPACE, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                       "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}      # no .pyc written beside read-only sources
        return [*self.limits(), *bwrap_argv(self.bwrap, self.workspace, self.config.read_only, environment, cwd,
                                            self.uid, info_fd, block_fd), *words]

    def run(self, command: Sequence[str] | str, *, stdin: str | bytes | None = None,
            env: Mapping[str, str] | None = None, cwd: str = WORKSPACE, timeout_s: float | None = None) -> ExecResult:
        """Run ``command`` to its end (or its timeout) and return its status, output and escape attempts."""
        if not self.workspace.is_dir():
            raise SandboxError(f"{self.directory} has no workspace (closed?)")
        timeout = self.config.timeout_s if timeout_s is None else min(timeout_s, self.config.timeout_s)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        started = time.monotonic()
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        try:
            process = subprocess.Popen(self.argv(command, env, cwd, info_write, block_read),
                                       stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                       pass_fds=(info_write, block_read))
        except BaseException:
            os.close(info_read)
            os.close(block_write)
            raise
        finally:
            os.close(info_write)
            os.close(block_read)
        init = namespace_init(info_read)
        try:
            tripwires = watch(init[0]) if init is not None else None
        finally:
            release(block_write)
        timed_out = False
        try:
            out, err = process.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)          # bwrap's death takes the namespace's init, and all in it
            out, err = process.communicate()
        finally:
            if init is not None:
                wait_for_teardown(init[1])
        attempts = self._count(tripwires)
        keep = self.config.max_output_kb * 1024
        return ExecResult(process.returncode, out[:keep].decode(errors="replace"), err[:keep].decode(errors="replace"),
                          timed_out, time.monotonic() - started, len(out) > keep or len(err) > keep, attempts)

    def _count(self, tripwires: Tripwires | None) -> dict[str, int]:
        """The command's attempts (its namespace gone), added to the ledger."""
        if tripwires is None:
            return {}
        try:
            attempts = tripwires.counts()
        finally:
            tripwires.close()
        if attempts:
            log.warning("sandbox %s: a command's escape attempts: %s", self.directory, attempts)
            with open(self.directory / LEDGER, "a") as ledger:       # one short append: whole, beside other writers
                ledger.write(json.dumps(attempts) + "\n")
        return attempts

    def attempts(self) -> dict[str, int]:
        """Escape attempts of all commands run here since the last ``reset``, by kind."""
        total: dict[str, int] = {}
        try:
            lines = (self.directory / LEDGER).read_text().splitlines()
        except FileNotFoundError:
            return total
        for line in lines:
            for kind, count in json.loads(line).items():
                total[kind] = total.get(kind, 0) + int(count)
        return total


__all__ = ["DESCRIPTION", "LEDGER", "ExecResult", "Sandbox", "SandboxError", "user_processes"]
