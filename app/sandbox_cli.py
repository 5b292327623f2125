"""``forge sandbox exec [--sandbox DIR] -- COMMAND``: run a command in a session's sandbox (``forge.rollout.sandbox``), the way a
black-box agent given ``FORGE_SANDBOX=DIR`` executes its commands: isolated, limited, and gone when it ends. Its
output is the command's, and so is its exit status (124 when the sandbox's timeout killed it)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from forge.cli.common import CONTEXT_SETTINGS
from forge.cli.options import settings_command
from forge.settings import Settings, setting

TIMED_OUT = 124


@click.group("sandbox", context_settings=CONTEXT_SETTINGS)
def sandbox_group() -> None:
    """Run commands in the sandboxes of code and terminal agents' sessions."""


@dataclass(frozen=True, kw_only=True)
class ExecConfig(Settings):
    sandbox: Path | None = setting(None, path="dir", env="FORGE_SANDBOX",
                                   help="The session's sandbox directory [default: $FORGE_SANDBOX, which Forge "
                                        "gives the agents it starts].")
    command: tuple[str, ...] = setting(argument=True, help="The command and its arguments.")


@settings_command("exec", ExecConfig, table="sandbox.exec")
def exec_command(config: ExecConfig) -> None:
    """Run COMMAND in a session's sandbox: its workspace is the working directory, nothing else of the host is
    writable, there is no network, and everything the command starts ends with it."""
    from forge.rollout.sandbox import Sandbox, SandboxError
    from forge.rollout.sandbox.tripwires import describe

    if config.sandbox is None:
        raise click.UsageError("no sandbox: give --sandbox DIR or set FORGE_SANDBOX")
    try:
        result = Sandbox.attach(config.sandbox).run(list(config.command), stdin=None if sys.stdin.isatty()
                                                    else sys.stdin.buffer.read())
    except (SandboxError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        sys.stderr.write(f"forge sandbox: killed after {config.sandbox}'s timeout\n")
    if result.attempts:
        sys.stderr.write(f"forge sandbox: refused: {describe(result.attempts)}\n")
    raise SystemExit(TIMED_OUT if result.timed_out else result.returncode % 256)


sandbox_group.add_command(exec_command)

__all__ = ["ExecConfig", "sandbox_group"]
