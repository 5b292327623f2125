"""Sandboxes against bare subprocesses: what isolation costs a code agent's session.

- Start-up latency: one command (``true``) in a fresh session's sandbox (slot taken, workspace seeded from a small
  task, the command run, the slot wiped) against the same command as a bare subprocess in a scratch directory.
- Sessions per second at 8 and 32 concurrent sessions, each seeding its workspace and running three commands (a
  file written, a Python one-liner, a listing), against bare subprocesses doing the same.

Medians of ``--repeats`` runs; the table gives each side and the ratio (sandbox / bare).

Usage: python bench/sandbox.py [--repeats 5] [--concurrency 8,32] [--sessions 64] [--json FILE]
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from forge.rollout.sandbox import SandboxConfig, SandboxPool

COMMANDS = ("echo data > out.txt", f"{sys.executable} -c 'print(sum(range(1000)))'", "ls -la")


def make_task(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for i in range(8):
        (directory / f"module_{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    return directory


def bare_session(task: Path, scratch: Path, commands: tuple[str, ...]) -> None:
    workspace = Path(tempfile.mkdtemp(dir=scratch))
    shutil.copytree(task, workspace, dirs_exist_ok=True)
    for command in commands:
        subprocess.run(command, shell=True, cwd=workspace, capture_output=True, check=True)
    shutil.rmtree(workspace)


def sandbox_session(pool: SandboxPool, task: Path, commands: tuple[str, ...]) -> None:
    with pool.session(task) as box:
        for command in commands:
            result = box.run(command)
            if not result.ok:
                raise RuntimeError(f"{command}: {result}")


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@click.command()
@click.option("--repeats", default=5, show_default=True)
@click.option("--concurrency", default="8,32", show_default=True)
@click.option("--sessions", default=64, show_default=True, help="Sessions per throughput run.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def main(repeats: int, concurrency: str, sessions: int, json_out: Path | None) -> None:
    levels = [int(c) for c in concurrency.split(",")]
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        task = make_task(scratch / "task")
        pool = SandboxPool(scratch / "pool", SandboxConfig(pool_size=max(levels)))
        results: dict[str, dict[str, float]] = {}
        latency = {"bare": [], "sandbox": []}
        for _ in range(repeats + 1):                    # the first round warms up
            latency["bare"].append(timed(lambda: bare_session(task, scratch, ("true",))))
            latency["sandbox"].append(timed(lambda: sandbox_session(pool, task, ("true",))))
        results["start-up s"] = {k: statistics.median(v[1:]) for k, v in latency.items()}
        for level in levels:
            rates = {"bare": [], "sandbox": []}
            for _ in range(repeats):
                with ThreadPoolExecutor(level) as executor:
                    for side, run in (("bare", lambda _: bare_session(task, scratch, COMMANDS)),
                                      ("sandbox", lambda _: sandbox_session(pool, task, COMMANDS))):
                        seconds = timed(lambda run=run: list(executor.map(run, range(sessions))))
                        rates[side].append(sessions / seconds)
            results[f"sessions/s at {level}"] = {k: statistics.median(v) for k, v in rates.items()}
        pool.close()
    click.echo(f"{'figure':<20}{'bare':>12}{'sandbox':>12}{'sandbox/bare':>14}")
    for name, row in results.items():
        click.echo(f"{name:<20}{row['bare']:>12.4f}{row['sandbox']:>12.4f}{row['sandbox'] / row['bare']:>13.2f}x")
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
