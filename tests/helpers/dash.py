"""``forge dash`` for tests: a run directory to show (a recorded pool, learner metrics, a summary) and the dash as a
real process on a loopback port, ready when its ready file appears."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx

from helpers.browse_pool import record_demo
from helpers.processes import Service


def make_run(run_dir: Path, steps: int = 30) -> dict[str, str]:
    """RUN_DIR/pool (``record_demo``), RUN_DIR/learner/metrics.jsonl (rewards of two domains, loss, tokens/s,
    staleness, tree compression) and RUN_DIR/summary.json; returns the pool's notable session ids."""
    roles = record_demo(run_dir / "pool")
    (run_dir / "learner").mkdir(parents=True, exist_ok=True)
    with (run_dir / "learner" / "metrics.jsonl").open("w") as handle:
        for step in range(1, steps + 1):
            handle.write(json.dumps({
                "step": step, "version": step, "loss": 1.0 / step, "policy_loss": 0.5 / step,
                "reward_mean": 0.5 + 0.3 * math.sin(step / 4), "reward/math": 0.4 + step / 100,
                "reward/web": 0.2 + step / 200, "tokens_per_s": 300.0 + 5 * step, "staleness_mean": step % 3,
                "staleness_max": 2, "tree_compression": 1.5 + step / 50, "positions": [step]}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"config": {"secret_file": "keys/x"}, "domains": ["math", "web"],
                                                      "eval_end": {"math": 0.75}}))
    return roles


def start_dash(run_dir: Path, out_dir: Path, *args: str, name: str = "dash") -> Service:
    """``forge dash RUN_DIR --port 0 ARGS``; its ready file and log are in ``out_dir``."""
    return Service(name, "forge", ["dash", str(run_dir), "--port", "0", *args], out_dir, timeout_s=120)


@contextlib.contextmanager
def dash_client(run_dir: Path, out_dir: Path, timeout_s: float = 60) -> Iterator[httpx.Client]:
    """A ``forge dash`` process on ``run_dir`` and an HTTP client of its URL; the process stopped after."""
    service = start_dash(run_dir, out_dir)
    try:
        with httpx.Client(base_url=service.info["url"], timeout=timeout_s) as http:
            yield http
    finally:
        service.stop()
