"""forge up's side of experiment tracking: its learner never writes to the trackers itself (forge up does, one
writer per run) but writes the sample table; and the lane's follower, which hands the trackers the learner's whole
new lines, the rollouts' figures once per learner step and the held-out readings, at steps that never go back.
(The settings they are given: test_run_settings_units.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

from forge.app.up.config import UpConfig
from forge.app.up.plan import Plan
from forge.app.up.tracking import LaneTracking
from forge.tracking import Tracker, TrackingConfig, open_trackers


class Kept(Tracker):
    name = "kept"

    def __init__(self) -> None:
        self.config, self.metrics, self.tables = {}, [], []

    def log_config(self, config):
        self.config = dict(config)

    def log_metrics(self, step, metrics):
        self.metrics.append((step, dict(metrics)))

    def log_table(self, step, name, rows):
        self.tables.append((step, name, rows))

    def close(self):
        pass


def test_the_learner_of_forge_up_writes_the_sample_table_but_logs_to_no_tracker(tmp_path):
    config = UpConfig(run_dir=tmp_path, tracking=TrackingConfig(trackers=("tensorboard",), sample_every=3,
                                                                sample_size=2))
    config = config.with_services(learner={"tracker": "mlflow"})       # a [learner] table asking for one anyway
    learner = {i.name: i for i in Plan(config).check()}["learner"].settings
    assert learner.tracking.trackers == ()
    assert (learner.tracking.sample_every, learner.tracking.sample_size) == (3, 2)


def test_a_lane_follows_the_learners_files_and_logs_at_steps_that_never_go_back(tmp_path):
    kept = Kept()
    trackers = open_trackers(TrackingConfig(), tmp_path, {"up": {}}, openers={"kept": lambda: kept})
    learner = tmp_path / "learner"
    learner.mkdir()
    lane = LaneTracking(trackers, learner)
    stats = SimpleNamespace(episodes=0, failed=0, reward=dict)
    lane.evaluation({"qa": 0.25}, {"qa": 0.5})                    # before any step: at step 0
    lane.rollouts(stats, {}, "learner", "gateway")
    with (learner / "metrics.jsonl").open("w") as handle:
        handle.write(json.dumps({"step": 1, "loss": 0.5, "positions": [0]}) + "\n" + '{"step": 2, "lo')
    (learner / "samples.jsonl").write_text(json.dumps({"step": 1, "rows": [{"domain": "qa", "text": "t"}]}) + "\n")
    assert lane.follow()
    stats.episodes, stats.failed = 8, 1
    stats.reward = lambda: {"qa": 0.75}
    gauges = {"actor-0": {"tokens_per_s": 10.0}, "actor-1": {"tokens_per_s": 5.0}, "gateway": {"calls_per_s": 2.0},
              "learner": {"staleness_mean": 0.5}}
    lane.rollouts(stats, gauges, "learner", "gateway")
    lane.rollouts(stats, gauges, "learner", "gateway")          # the same step: not again
    with (learner / "metrics.jsonl").open("a") as handle:
        handle.write('ss": 0.25}\n')                              # the line being written, finished
    lane.evaluation({"qa": 0.75}, {})
    trackers.close()
    steps = [(step, sorted(metrics)) for step, metrics in kept.metrics]
    assert steps[0] == (0, ["eval/greedy/qa", "eval/reward/qa"])
    assert steps[1][0] == 0 and "rollout/sessions_per_s" in steps[1][1]
    assert steps[2] == (1, ["learner/loss"])
    assert steps[3][0] == 1
    rollout = kept.metrics[3][1]
    assert rollout["rollout/actor_tokens_per_s"] == 15.0 and rollout["rollout/calls_per_s"] == 2.0
    assert rollout["rollout/staleness_mean"] == 0.5 and rollout["rollout/failed_sessions"] == 1
    assert rollout["rollout/sessions"] == 8 and rollout["rollout/reward/qa"] == 0.75
    assert kept.metrics[4] == (2, {"learner/loss": 0.25}) and kept.metrics[5] == (2, {"eval/reward/qa": 0.75})
    assert len(kept.metrics) == 6
    assert kept.tables == [(1, "samples", [{"domain": "qa", "text": "t"}])]
    assert [step for step, _ in kept.metrics] == sorted(step for step, _ in kept.metrics)
