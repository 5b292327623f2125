"""The learner's side of experiment tracking: every step's scalars as the trackers take them, the sample table of
every few steps (trajectories as text with their rewards, advantages, versions and staleness) in samples.jsonl and
to the trackers, and training that goes on, with one warning, when a tracker raises mid-run."""

from __future__ import annotations

import json
import logging

from forge.learner.losses import LossConfig
from forge.learner.metrics import scalars
from forge.learner.parallel import Distributed
from forge.learner.rewards import RewardConfig
from forge.learner.sample_table import SampleLog, trajectory_text
from forge.learner.trainer import Trainer, TrainerConfig
from forge.pool import Pool
from forge.pool.window import WindowConfig
from forge.tracking import Tracker, TrackingConfig, open_trackers
from forge.v1 import pool_pb2

from helpers.learner_runs import fill_from, make_model

STEPS = 4


class Kept(Tracker):
    """A tracker that keeps what it is given, and raises at ``fail_at``."""

    name = "kept"

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at, self.steps, self.tables = fail_at, [], []

    def log_config(self, config):
        pass

    def log_metrics(self, step, metrics):
        if step == self.fail_at:
            raise RuntimeError("the tracker's server went away")
        self.steps.append((step, dict(metrics)))

    def log_table(self, step, name, rows):
        self.tables.append((step, name, rows))

    def close(self):
        pass


def test_a_trajectorys_text_is_each_calls_new_prompt_then_its_completion():
    calls = [pool_pb2.CallRecord(index=0, prompt_ids=[1, 2], completion_ids=[3]),
             pool_pb2.CallRecord(index=1, prompt_ids=[1, 2, 3, 4], completion_ids=[5, 6]),
             pool_pb2.CallRecord(index=2, prompt_ids=[9], completion_ids=[7])]     # a rewritten context, whole
    text, completions = trajectory_text(calls, lambda ids: "".join(f"<{i}>" for i in ids))
    assert text == "<1><2><3><4><5><6><9><7>" and completions == ["<3>", "<5><6>", "<7>"]


def test_training_goes_on_when_a_tracker_raises_and_sample_tables_reach_the_others(tmp_path, caplog):
    model = make_model()
    pool = Pool(tmp_path / "pool")
    fill_from(pool, model, groups=2 * STEPS, group_size=2, calls=2)
    flaky, kept = Kept(fail_at=2), Kept()
    trackers = open_trackers(TrackingConfig(), tmp_path / "run", openers={"flaky": lambda: flaky,
                                                                         "kept": lambda: kept})
    samples = tmp_path / "run" / "samples.jsonl"
    log = SampleLog(samples, every=2, size=3, decode=lambda ids: " ".join(map(str, ids)),
                    on_rows=lambda step, rows: trackers.log_table(step, "samples", rows))
    trainer = Trainer(model, Distributed(), TrainerConfig(lr=1e-3, max_steps=STEPS), LossConfig(), RewardConfig(),
                      WindowConfig(window=4, batch_groups=2, max_wait_s=0.5), pool, sample_log=log)
    with caplog.at_level(logging.WARNING, logger="forge.tracking"):
        trainer.run(on_step=lambda record: trackers.log_metrics(record["step"], scalars(record)))
        trackers.close()
    pool.close()
    assert trainer.state.step == STEPS
    assert [step for step, _ in kept.steps] == [1, 2, 3, 4] and [step for step, _ in flaky.steps] == [1]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "tracker flaky failed and is dropped for the rest of the run: the tracker's server went away"]
    first = kept.steps[0][1]
    assert {"learner/loss", "learner/reward_mean", "learner/tokens_per_s", "learner/reward/qa",
            "learner/staleness_mean"} <= set(first)
    assert "learner/positions" not in first and "learner/step" not in first

    written = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [t["step"] for t in written] == [2, 4] == [step for step, _, _ in kept.tables]
    rows = written[0]["rows"]
    assert len(rows) == 3 and rows == kept.tables[0][2]
    assert len({row["task"] for row in rows}) == 2         # one trajectory of each group in turn
    for row in rows:
        assert row["domain"] == "qa" and row["calls"] == 2 and row["step"] == 2
        assert row["text"] and json.loads(row["tool_calls"]) == []
        assert len(json.loads(row["advantage"])) == 2 and len(json.loads(row["rewards"])) == 2
        assert row["weights_version"] == 0 and row["staleness"] == 1        # sampled by version 0, trained at 1


def test_a_sample_table_that_cannot_be_written_costs_its_rows_not_the_step(tmp_path, caplog):
    model = make_model()
    pool = Pool(tmp_path / "pool")
    fill_from(pool, model, groups=2 * STEPS, group_size=2, calls=2)
    (tmp_path / "run").write_text("a file where the run's folder should be")
    kept = Kept()
    log = SampleLog(tmp_path / "run" / "samples.jsonl", every=2, size=3, decode=lambda ids: " ".join(map(str, ids)),
                    on_rows=lambda step, rows: kept.log_table(step, "samples", rows))
    trainer = Trainer(model, Distributed(), TrainerConfig(lr=1e-3, max_steps=STEPS), LossConfig(), RewardConfig(),
                      WindowConfig(window=4, batch_groups=2, max_wait_s=0.5), pool, sample_log=log)
    with caplog.at_level(logging.WARNING, logger="forge.learner.sample_table"):
        trainer.run()
    pool.close()
    assert trainer.state.step == STEPS
    assert [step for step, _, _ in kept.tables] == [2, 4]             # the trackers still get the rows
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and all("sample table was not written" in w for w in warnings)
