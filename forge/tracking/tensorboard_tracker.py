"""TensorBoard: event files in RUN_DIR/tensorboard/RUN_NAME (``tensorboard --logdir RUN_DIR/tensorboard``): metrics
as scalars, the settings and sample tables as text."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from forge.tracking.base import Tracker
from forge.tracking.config import TrackingConfig


def _markdown_code(text: str) -> str:
    """``text`` as a block TensorBoard's text plugin shows verbatim (indented four spaces)."""
    return "\n".join("    " + line for line in text.splitlines())


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", "<br>")


class TensorboardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, config: TrackingConfig, run_dir: Path, run_name: str) -> None:
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard" / run_name))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", _markdown_code(json.dumps(config, indent=2)), 0)
        self.writer.flush()

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
