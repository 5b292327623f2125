"""``forge plot``: reward (overall and per domain), loss and throughput curves of a run, from the learner's JSONL
metrics, to a PNG (matplotlib, Agg backend: no display needed).

Data extraction (:func:`load_records`, :func:`run_series`) is separate from drawing (:func:`draw`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 9.0, 100        # 1000 x 900 pixels


class NoMetrics(ValueError):
    """The metrics file is missing or holds no records."""


def metrics_path(path: Path) -> Path:
    """An explicit JSONL file, or the run directory's ``metrics.jsonl`` or ``learner/metrics.jsonl``."""
    if path.is_file():
        return path
    candidates = [path / "metrics.jsonl", path / "learner" / "metrics.jsonl"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise NoMetrics(f"no metrics in {path}: looked for {' and '.join(str(c) for c in candidates)}")


def load_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSONL file and how many lines were not one (e.g. a line being written)."""
    records, skipped = [], 0
    with path.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                skipped += 1
    return records, skipped


def _value(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


@dataclass
class RunSeries:
    """The curves of a run, one value per step (NaN where a record lacks the figure)."""

    steps: list[float]
    reward: list[float]
    reward_by_domain: dict[str, list[float]] = field(default_factory=dict)
    loss: list[float] = field(default_factory=list)
    policy_loss: list[float] = field(default_factory=list)
    mtp_loss: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)


def run_series(records: list[dict[str, Any]]) -> RunSeries:
    """One point per step; a step recorded twice (redone after a restart) keeps its last record."""
    by_step: dict[float, dict[str, Any]] = {}
    for index, record in enumerate(records):
        step = _value(record, "step")
        by_step[index if math.isnan(step) else step] = record
    if not by_step:
        raise NoMetrics("the metrics file holds no records")
    steps = sorted(by_step)
    ordered = [by_step[s] for s in steps]
    domains = sorted({k.removeprefix("reward/") for r in ordered for k in r if k.startswith("reward/")})

    def column(key: str) -> list[float]:
        return [_value(r, key) for r in ordered]

    return RunSeries(
        steps=[float(s) for s in steps], reward=column("reward_mean"),
        reward_by_domain={d: column(f"reward/{d}") for d in domains},
        loss=column("loss"), policy_loss=column("policy_loss"), mtp_loss=column("mtp_loss"),
        tokens_per_s=column("tokens_per_s"),
    )


def _has_data(values: list[float]) -> bool:
    return any(not math.isnan(v) for v in values)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values, skipping NaNs (NaN where the window holds none): a step's
    reward comes from a few sessions, so the raw curve is mostly noise."""
    out, recent = [], []
    for value in values:
        recent.append(value)
        if len(recent) > window:
            recent.pop(0)
        present = [v for v in recent if not math.isnan(v)]
        out.append(sum(present) / len(present) if present else math.nan)
    return out


def draw(series: RunSeries, out: Path, title: str = "") -> Path:
    """Three panels (reward, loss, tokens/s) over the steps, written to ``out`` as a PNG of 1000 x 900 pixels."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    reward_ax, loss_ax, speed_ax = figure.subplots(3, 1, sharex=True)
    x = series.steps
    marker = "o" if len(x) < 30 else None
    window = max(1, len(x) // 25)
    label = f" (mean of {window} steps)" if window > 1 else ""
    if window > 1:
        reward_ax.plot(x, series.reward, color="black", linewidth=0.5, alpha=0.15)
    reward_ax.plot(x, smooth(series.reward, window), label=f"reward{label}", color="black", linewidth=2,
                   marker=marker)
    for domain, values in series.reward_by_domain.items():
        reward_ax.plot(x, smooth(values, window), label=f"reward/{domain}", linewidth=1.2, alpha=0.9, marker=marker)
    reward_ax.set_ylabel("reward")
    loss_ax.plot(x, series.loss, label="loss", color="tab:red", marker=marker)
    for name, values in (("policy loss", series.policy_loss), ("mtp loss", series.mtp_loss)):
        if _has_data(values) and values != series.loss:
            loss_ax.plot(x, values, label=name, linewidth=1, alpha=0.7)
    loss_ax.set_ylabel("loss")
    speed_ax.plot(x, series.tokens_per_s, label="tokens/s", color="tab:green", marker=marker)
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_xlabel("step")
    for ax in (reward_ax, loss_ax, speed_ax):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    figure.suptitle(title or "forge run")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=DPI)
    return out
