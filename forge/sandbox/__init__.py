"""Isolated places for code and terminal agents: one sandbox per session, built on bubblewrap (``bwrap``), with no
network, a private writable workspace over a read-only system, CPU, memory, file-size, process and time limits, and
nothing left running after a command; pooled for reuse at RL concurrency (``SandboxPool``)."""

from forge.sandbox.bwrap import INSTALL_HINT, WORKSPACE, find_bwrap
from forge.sandbox.config import SandboxConfig
from forge.sandbox.pool import SandboxPool
from forge.sandbox.sandbox import ExecResult, Sandbox, SandboxError

__all__ = ["INSTALL_HINT", "WORKSPACE", "ExecResult", "Sandbox", "SandboxConfig", "SandboxError", "SandboxPool",
           "find_bwrap"]
