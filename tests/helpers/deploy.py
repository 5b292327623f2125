"""forge deploy run on a team's run file (through its click command), and readers of what it writes: the Kubernetes
documents and containers, and the steps a Slurm batch script starts."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click
import yaml
from click.testing import CliRunner

from forge.app.main import forge

TEAM = """
[model]
path = "tiny"

[tasks]
train = "tasks/train.jsonl"
eval = "tasks/eval.jsonl"
verifier = "verify.py:score"

[agent]
command = ["python", "agent.py"]

[learner]
lr = 2e-4

[actor]
kv_cache_mb = 96

[pool]
session_timeout = 600
"""


def run_file(tmp_path: Path, text: str = TEAM, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def deploy(tmp_path: Path, target: str, *args: str, text: str = TEAM) -> tuple[click.testing.Result, Path]:
    out = tmp_path / f"out-{target}"
    extra = ["--shared-dir", "/shared/forge"] if target == "slurm" else []
    result = CliRunner().invoke(forge, ["deploy", "--config", str(run_file(tmp_path, text)), "--target", target,
                                        "--out", str(out), *extra, *args])
    return result, out


def documents(out: Path) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(out.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


def containers(out: Path) -> list[dict[str, Any]]:
    found = []
    for _, doc in documents(out):
        if doc["kind"] in ("StatefulSet", "Job"):
            found += doc["spec"]["template"]["spec"]["containers"]
    return found


def slurm_starts(script: str) -> list[tuple[str, list[str]]]:
    """(step name, command words) of every ``start NAME NODE COMMAND...`` of a batch script."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True) if line.startswith("start ") else []
        if words:
            found.append((words[1], words[3:]))
    return found
