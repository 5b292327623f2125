"""What ``forge dash`` reads from a run directory: its pools, the learner's metrics as curves (read incrementally,
so a poll costs what was appended since the last one) and the run's summary."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.pool import PoolReader

POOL_NAMES = ("pool", "eval-pool")
# The curves the dash draws, by metric key of learner/metrics.jsonl; reward/<domain> keys are added as found.
CURVES = ("reward_mean", "loss", "policy_loss", "tokens_per_s", "staleness_mean", "staleness_max",
          "tree_compression", "ratio_mean", "clip_frac")
HIDDEN_SUMMARY_KEYS = ("config",)       # the run's settings: long, and may name key files


def find_pools(run_dir: Path) -> dict[str, Path]:
    """The pools of a run directory by name relative to it: RUN_DIR/pool, RUN_DIR/eval-pool, and those of each
    run of a multi-run ``forge up`` one folder down (``NAME/pool``)."""
    found: dict[str, Path] = {}
    for pattern in (*POOL_NAMES, *(f"*/{name}" for name in POOL_NAMES)):
        for path in sorted(run_dir.glob(pattern)):
            if (path / "data.mdb").is_file():
                found[path.relative_to(run_dir).as_posix()] = path
    return found


def metrics_file(run_dir: Path) -> Path:
    return run_dir / "learner" / "metrics.jsonl" if (run_dir / "learner").is_dir() else run_dir / "metrics.jsonl"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class Curves:
    """The learner's metrics file read so far: one point per step (a step written again after a restart replaces
    its point). ``read`` takes what was appended since the last call; a partly written last line waits."""

    path: Path
    offset: int = 0
    points: dict[float, dict[str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        with self.lock:
            try:
                with self.path.open("rb") as handle:
                    if handle.seek(0, 2) < self.offset:        # truncated or replaced: start over
                        self.offset, self.points = 0, {}
                    handle.seek(self.offset)
                    data = handle.read()
            except FileNotFoundError:
                return
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                self._add(line)

    def _add(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict):
            return
        step = _number(record.get("step"))
        if step is None:
            return
        point = {key: number for key, value in record.items()
                 if (key in CURVES or key.startswith("reward/")) and (number := _number(value)) is not None}
        self.points[step] = point

    def series(self) -> dict[str, Any]:
        """{"steps": [...], "curves": {name: [value or None per step]}}."""
        self.read()
        with self.lock:
            steps = sorted(self.points)
            names = sorted({k for p in self.points.values() for k in p})
            return {"steps": steps, "curves": {n: [self.points[s].get(n) for s in steps] for n in names}}


def summary(run_dir: Path) -> dict[str, Any] | None:
    """RUN_DIR/summary.json without the run's settings, or None when there is none (yet) or it is unreadable."""
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: v for k, v in data.items() if k not in HIDDEN_SUMMARY_KEYS}


class Pools:
    """The run's pools, opened read-only on first use and kept open (a reader never blocks the gateway)."""

    def __init__(self, run_dir: Path | None, extra: Path | None = None) -> None:
        self.run_dir = run_dir
        self.extra = extra
        self._open: dict[str, PoolReader] = {}
        self._lock = threading.Lock()

    def names(self) -> dict[str, Path]:
        found = find_pools(self.run_dir) if self.run_dir is not None else {}
        if self.extra is not None:
            found = {"pool": self.extra, **{k: v for k, v in found.items() if k != "pool"}}
        return found

    def reader(self, name: str) -> PoolReader:
        """The pool named ``name``; KeyError for a name the run does not have."""
        with self._lock:
            if name not in self._open:
                path = self.names()[name]
                self._open[name] = PoolReader(path)
            return self._open[name]

    def close(self) -> None:
        with self._lock:
            for reader in self._open.values():
                reader.close()
            self._open.clear()
