"""Training metrics: one JSON object per step appended to a JSONL file (flushed each step), and a one-line
progress summary for stdout."""

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


def summary(record: dict[str, Any]) -> str:
    rewards = " ".join(f"{k.removeprefix('reward/')}={v:.3f}" for k, v in sorted(record.items())
                       if k.startswith("reward/"))
    return (f"step {record['step']:>5d} v{record['version']} loss {record['loss']:+.4f} "
            f"reward {record['reward_mean']:.3f} [{rewards}] tokens {record['tokens']} "
            f"{record['tokens_per_s']:.0f} tok/s tree x{record['tree_compression']:.1f} staleness {record['staleness_mean']:.2f} "
            f"window {record['window']} head {record['head']}")
