"""``forge plot``: the curves come from the learner's JSONL (steps redone after a restart keep their last record),
the PNG decodes at the expected size, both run-directory layouts and an explicit file work, errors are clear."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from forge.app.top.cli import plot
from forge.app.top.plot import DPI, HEIGHT_IN, WIDTH_IN, NoMetrics, load_records, metrics_path, run_series, smooth


def record(step: int, **extra) -> dict:
    return {"step": step, "version": step, "loss": 1.0 / step, "policy_loss": 0.9 / step, "mtp_loss": 1.0,
            "reward_mean": step / 10, "tokens_per_s": 100.0 * step, "positions": [step], **extra}


def write(path, records, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_series_come_from_the_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [record(1, **{"reward/math": 0.1}), record(2, **{"reward/math": 0.2, "reward/code": 0.5}),
               record(3, **{"reward/code": 0.7}), record(2, **{"reward/math": 0.25, "reward/code": 0.55})]
    records[2]["loss"] = None                               # a non-finite loss is written as null
    write(path, records, tail='{"step": 4, "lo')            # a line being written
    loaded, skipped = load_records(path)
    assert len(loaded) == 4 and skipped == 1
    series = run_series(loaded)
    assert series.steps == [1.0, 2.0, 3.0]
    assert series.reward == [0.1, 0.2, 0.3]
    assert series.tokens_per_s == [100.0, 200.0, 300.0]
    assert series.loss[:2] == [1.0, 0.5] and math.isnan(series.loss[2])
    assert list(series.reward_by_domain) == ["code", "math"]
    assert series.reward_by_domain["math"][:2] == [0.1, 0.25] and math.isnan(series.reward_by_domain["math"][2])
    assert math.isnan(series.reward_by_domain["code"][0]) and series.reward_by_domain["code"][1:] == [0.55, 0.7]


def test_metrics_path_accepts_both_layouts_and_a_file(tmp_path):
    write(tmp_path / "a" / "metrics.jsonl", [record(1)])
    write(tmp_path / "b" / "learner" / "metrics.jsonl", [record(1)])
    assert metrics_path(tmp_path / "a") == tmp_path / "a" / "metrics.jsonl"
    assert metrics_path(tmp_path / "b") == tmp_path / "b" / "learner" / "metrics.jsonl"
    assert metrics_path(tmp_path / "a" / "metrics.jsonl") == tmp_path / "a" / "metrics.jsonl"
    with pytest.raises(NoMetrics, match="looked for"):
        metrics_path(tmp_path)


def test_smoothing_is_a_trailing_mean_that_skips_gaps():
    nan = math.nan
    assert smooth([1.0, 3.0, nan, 5.0, 7.0], 2) == [1.0, 2.0, 3.0, 5.0, 6.0]
    assert smooth([1.0, 2.0], 1) == [1.0, 2.0]
    assert math.isnan(smooth([nan, nan, 4.0], 2)[1]) and smooth([nan, nan, 4.0], 2)[2] == 4.0


def test_plot_writes_a_png_of_the_expected_size(tmp_path):
    from matplotlib.image import imread

    run = tmp_path / "run"
    write(run / "learner" / "metrics.jsonl",
          [record(s, **{"reward/math": s / 20, "reward/code": s / 30}) for s in range(1, 41)])
    result = CliRunner().invoke(plot, [str(run)])
    assert result.exit_code == 0, result.output
    assert "40 steps" in result.output and "code, math" in result.output
    image = imread(run / "metrics.png")
    assert image.shape[:2] == (int(HEIGHT_IN * DPI), int(WIDTH_IN * DPI))
    assert image[..., :3].std() > 0.05                      # something is drawn

    out = tmp_path / "elsewhere" / "curves.png"
    result = CliRunner().invoke(plot, [str(run / "learner" / "metrics.jsonl"), "--out", str(out), "--title", "t"])
    assert result.exit_code == 0, result.output
    assert imread(out).shape[:2] == (900, 1000)


def test_plot_errors_are_clear(tmp_path):
    empty = tmp_path / "empty"
    write(empty / "metrics.jsonl", [], tail="\n\nnot json\n")
    result = CliRunner().invoke(plot, [str(empty)])
    assert result.exit_code == 1 and "holds no records (1 unreadable lines)" in result.output
    result = CliRunner().invoke(plot, [str(tmp_path)])
    assert result.exit_code == 1 and "no metrics in" in result.output
    result = CliRunner().invoke(plot, [str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output
