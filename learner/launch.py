"""The learner's torchrun job on this node, run as a child of ``forge-learner``: a stop signal reaches the ranks
(which agree to stop after the current step and checkpoint), not torchrun's agent, which would end them and report
the job failed; the agent ignores SIGTERM and SIGINT, even sent to it directly. If ``forge-learner`` itself dies,
or a stop comes before the ranks exist, the agent is told to end the job (SIGHUP)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Mapping

from forge.reaper import child_pids

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def without_nproc(args: tuple[str, ...]) -> list[str]:
    """``args`` less their ``--nproc N`` and ``--nproc=N``: the ranks read it from their environment (torchrun's own
    parser would take it as its ``--nproc-per-node``)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


def _start_agent() -> None:
    """In the agent's process before it runs: ignore the stop signals, which are the ranks' (they install their own
    handlers; a scheduler such as Slurm signals every process of a job step, the agent included); and stop when
    ``forge-learner`` dies (Linux parent-death signal, SIGHUP, which the agent handles by ending the ranks)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):     # not Linux: the agent outlives a killed parent
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)


class TorchrunJob:
    """``command`` (a torchrun invocation) in a session of its own, with ``env`` on top of this process's
    environment; ``run`` waits for it and returns its status."""

    def __init__(self, command: list[str], env: Mapping[str, str] | None = None) -> None:
        self.command = command
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    def run(self) -> int:
        self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True,
                                        preexec_fn=_start_agent)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        return self.process.wait()

    def _forward(self, signum: int, _frame: object) -> None:
        """Hand the stop to the ranks; before they exist (rendezvous), to the agent."""
        assert self.process is not None
        ranks = child_pids(self.process.pid)
        log.info("received %s: asking %d learner rank(s) on this node to stop after the current step",
                 signal.Signals(signum).name, len(ranks))
        for pid in ranks or [self.process.pid]:
            with contextlib.suppress(ProcessLookupError):     # already gone
                os.kill(pid, signal.SIGTERM if ranks else signal.SIGHUP)
