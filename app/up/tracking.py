"""``forge up``'s experiment trackers, written from the up process alone (the learner's own trackers stay off, so a
tracker can never disturb training and each run has one writer): per lane, a run in every tracker ``[tracking]``
names, given the resolved settings of forge up and of every service; the learner's metrics and sample tables
followed from its metrics.jsonl and samples.jsonl; the rollout figures (sessions/s, actor tokens/s, staleness,
failures) at each learner step; and the held-out reward per domain at each evaluation."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from forge.app.up.config import UpConfig
from forge.app.up.run_settings import run_settings
from forge.learner.metrics import scalars
from forge.tracking import Trackers, open_trackers


class JsonLines:
    """The whole lines a file has gained since the last read (a line still being written waits for the next)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        found = []
        for line in whole.splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found


class LaneTracking:
    """One lane's run in the trackers: the learner's files followed, the rollouts' figures, the evaluations. Steps
    only grow, as W&B needs: what is not the learner's is logged at the latest learner step seen."""

    def __init__(self, trackers: Trackers, learner_dir: Path) -> None:
        self.trackers = trackers
        self.metrics = JsonLines(learner_dir / "metrics.jsonl")
        self.samples = JsonLines(learner_dir / "samples.jsonl")
        self.step = 0
        self.rollout_step = -1
        self.last: tuple[float, int] = (time.time(), 0)        # (when, sessions) at the last rollout figures

    def follow(self) -> bool:
        """Log the learner's new steps and sample tables; whether there were any."""
        records = self.metrics.new()
        for record in records:
            self.step = max(self.step, int(record["step"]))
            self.trackers.log_metrics(int(record["step"]), scalars(record))
        for table in self.samples.new():
            self.trackers.log_table(int(table["step"]), "samples", table["rows"])
        return bool(records)

    def rollouts(self, stats: Any, gauges: dict[str, dict[str, float]], learner: str, gateway: str) -> None:
        """The rollout side's figures at the current step, once per step (``stats``: the lane driver's)."""
        if self.step == self.rollout_step:
            return
        now, (then, sessions) = time.time(), self.last
        actors = [figures for name, figures in gauges.items() if name.startswith("actor-")]
        self.trackers.log_metrics(self.step, {
            "rollout/sessions": stats.episodes, "rollout/failed_sessions": stats.failed,
            "rollout/sessions_per_s": (stats.episodes - sessions) / max(now - then, 1e-9),
            "rollout/actor_tokens_per_s": sum(a.get("tokens_per_s", 0.0) for a in actors),
            "rollout/calls_per_s": gauges.get(gateway, {}).get("calls_per_s", 0.0),
            "rollout/staleness_mean": gauges.get(learner, {}).get("staleness_mean", 0.0),
            **{f"rollout/reward/{domain}": value for domain, value in stats.reward().items()}})
        self.rollout_step, self.last = self.step, (now, stats.episodes)

    def evaluation(self, sampled: dict[str, float], greedy: dict[str, float]) -> None:
        """A held-out reading, at the latest learner step."""
        self.follow()
        self.trackers.log_metrics(self.step, {**{f"eval/reward/{d}": v for d, v in sampled.items()},
                                              **{f"eval/greedy/{d}": v for d, v in greedy.items()}})


def open_lanes(config: UpConfig, instances: dict[str, Any], lanes: list[Any]) -> dict[str, LaneTracking]:
    """A run in the trackers per lane (by lane name; none when no tracker is named). ``lanes``: forge up's
    ``Lane``s."""
    if not config.tracking.trackers:
        return {}
    settings = run_settings(config, instances)
    return {lane.name: LaneTracking(open_trackers(config.tracking, config.run_dir, settings,
                                                  suffix=f"-{lane.name}" if lane.name else ""),
                                    lane.directory / "learner") for lane in lanes}
