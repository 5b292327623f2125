"""Training metrics: one JSON object per step appended to a JSONL file (flushed each step), a one-line
progress summary for stdout, and a step's scalars as experiment trackers take them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, default=_plain) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


NOT_SCALARS = ("step", "time")     # the step is the trackers' x axis; the wall clock is theirs too


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a step's record under ``learner/`` (``learner/loss``, ``learner/reward/qa``), for the
    trackers; lists (the positions trained) and the step itself left out."""
    return {f"learner/{key}": float(value) for key, value in record.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and key not in NOT_SCALARS
            and math.isfinite(value)}


def summary(record: dict[str, Any]) -> str:
    rewards = " ".join(f"{k.removeprefix('reward/')}={v:.3f}" for k, v in sorted(record.items())
                       if k.startswith("reward/"))
    return (f"step {record['step']:>5d} v{record['version']} loss {record['loss']:+.4f} "
            f"reward {record['reward_mean']:.3f} [{rewards}] tokens {record['tokens']} "
            f"{record['tokens_per_s']:.0f} tok/s tree x{record['tree_compression']:.1f} staleness {record['staleness_mean']:.2f} "
            f"window {record['window']} head {record['head']}")
