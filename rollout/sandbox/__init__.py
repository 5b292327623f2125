"""Isolated places for code and terminal agents: one sandbox per session, built on bubblewrap (``bwrap``), with no
network, a private writable workspace over a read-only system, CPU, memory, file-size, process and time limits, and
nothing left running after a command; pooled for reuse at RL concurrency (``SandboxPool``)."""

from forge.rollout.sandbox.bwrap import INSTALL_HINT, WORKSPACE, find_bwrap
from forge.rollout.sandbox.config import SandboxConfig
from forge.rollout.sandbox.pool import SandboxPool
from forge.rollout.sandbox.sandbox import ExecResult, Sandbox, SandboxError

__all__ = ["INSTALL_HINT", "WORKSPACE", "ExecResult", "Sandbox", "SandboxConfig", "SandboxError", "SandboxPool",
           "find_bwrap"]
