"""Short runs of the whole system on the built-in tiny model, as the environment and agent tests make them:
``forge up --config`` with the given tables for two learner steps, and ``forge rollout`` against an actor and a
keyed gateway of its own; and what their pools hold."""

from __future__ import annotations

import subprocess
from pathlib import Path

from forge.pool import PoolReader
from forge.v1 import pool_pb2

from conftest import script
from helpers.forge_many import forge_commands

UP = '''
[up]
minutes = 20
steps = 2
eval_samples = 1
groups_in_flight = 4
max_tokens = {max_tokens}

[learner]
batch_groups = 2
'''


def up_args(tmp_path: Path, tables: str, max_tokens: int = 96) -> list[str]:
    """``forge up``'s arguments (after the program) for a run file of ``tables`` (TOML) besides [model] tiny and a
    two-step [up], written to tmp_path/run.toml, into tmp_path/run."""
    path = tmp_path / "run.toml"
    path.write_text('[model]\npath = "tiny"\n\n' + tables + "\n" + UP.format(max_tokens=max_tokens))
    return ["up", "--config", str(path), "--run-dir", str(tmp_path / "run")]


def forge_up(tmp_path: Path, tables: str, timeout: float = 900, max_tokens: int = 96,
             args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``forge up`` (see ``up_args``) in tmp_path, with ``args`` on its command line."""
    return subprocess.run([script("forge"), *up_args(tmp_path, tables, max_tokens), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def forge_ups_refused(runs: list[tuple[Path, str]], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """``forge up`` (see ``up_args``) on each (tmp_path, tables) of ``runs``, in its tmp_path: commands expected to
    refuse before anything starts, run one after another in one process (``forge_many``), which pays the imports
    once. Each one's exit status and output, as its own process would have ended."""
    return forge_commands([(up_args(tmp_path, tables), tmp_path) for tmp_path, tables in runs], timeout)


def forge_rollout(tmp_path: Path, run_file: Path, episodes: int, evaluate: bool = False
                  ) -> subprocess.CompletedProcess:
    """``forge rollout --config run_file`` for ``episodes`` sessions through a keyed gateway (its pool in
    tmp_path/pool) in front of a tiny-model actor, both started here and stopped after. With ``evaluate``, the
    held-out tasks through a second gateway (its pool in tmp_path/eval-pool) and the summary in
    tmp_path/summary.json."""
    from helpers.gateway_procs import start_actor, start_gateway

    key_file = tmp_path / "gateway.key"
    key_file.write_text("# the gateway's key, kept off every command line\nrollout-test-key\n")
    actor = start_actor(tmp_path, "actor", "--model", "tiny")
    doors = [start_gateway(tmp_path, [actor.address], tmp_path / "pool", "--api-key-file", str(key_file))]
    try:
        if evaluate:
            doors.append(start_gateway(tmp_path, [actor.address], tmp_path / "eval-pool", "--api-key-file",
                                       str(key_file), name="gateway-eval"))
        gateway = doors[0]
        extra = ["--eval-gateway", doors[1].grpc_address, "--eval-http", doors[1].http, "--summary",
                 str(tmp_path / "summary.json")] if evaluate else []
        return subprocess.run([script("forge"), "rollout", "--config", str(run_file), "--gateway",
                               gateway.info["grpc_address"], "--http", gateway.info["http_address"],
                               "--api-key-file", str(key_file), "--episodes", str(episodes), *extra],
                              capture_output=True, text=True, timeout=500, cwd=tmp_path)
    finally:
        for door in doors:
            door.stop()
        actor.stop()


def stored_sessions(pool_dir: Path) -> list:
    """Every session the pool at ``pool_dir`` holds, with its calls."""
    with PoolReader(pool_dir) as pool:
        return [pool.get_session(s) for e in pool.entries(start=0, limit=100_000) for s in e.members]


def completed(pool_dir: Path) -> list:
    return [s for s in stored_sessions(pool_dir) if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
