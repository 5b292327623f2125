"""``forge pool export``: one row per call as JSON Lines and Parquet, read back by pandas and datasets, with the
pool's filters, and bad input refused before any reading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge.pool.cli import pool_group

from helpers.browse_pool import MARKUP, record_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "pool"
    record_demo(path)
    return path


def test_export_parquet_reads_in_pandas_and_datasets(demo, tmp_path):
    import datasets
    import pandas

    path = demo
    out = tmp_path / "calls.parquet"
    result = CliRunner().invoke(pool_group, ["export", str(path), "--format", "parquet", "-o", str(out),
                                             "--model", "tiny", "--min-version", "2"])
    assert result.exit_code == 0, result.output
    frame = pandas.read_parquet(out)
    assert list(frame["session_id"]) == ["math-0", "math-0", "math-2", "math-2", "web-0", "web-1"]
    assert frame["completion_text"].iloc[4] == MARKUP and list(frame["weight_versions"].iloc[1]) == [2] * 6
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train",
                                   cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == 6 and loaded[1]["process_rewards"] == [0.25]
    assert loaded[0]["prompt_ids"] == list(frame["prompt_ids"].iloc[0])


def test_export_jsonl_reads_in_pandas_and_datasets(demo, tmp_path):
    import datasets
    import pandas

    path = demo
    out = tmp_path / "calls.jsonl"
    result = CliRunner().invoke(pool_group, ["export", str(path), "-o", str(out), "--status", "completed"])
    assert result.exit_code == 0, result.output
    frame = pandas.read_json(out, lines=True)
    assert len(frame) == 6 and "completion_text" not in frame
    loaded = datasets.load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == 6 and loaded[0]["session_id"] == "math-0"


@pytest.mark.parametrize(("args", "message"), [
    (["{missing}"], "is not a directory"),
    (["{pool}", "--format", "csv"], "'csv' is not one of"),
    (["{pool}", "--format", "parquet"], "parquet needs a file"),
    (["{pool}", "--min-reward", "2", "--max-reward", "1"], "range is empty"),
    (["{pool}", "--min-version", "-1"], "-1"),
    (["{pool}", "--status", "done"], "'done' is not one of"),
    (["{pool}", "--min-reward", "nan"], "finite"),
    (["{pool}", "-o", "{missing}/out.jsonl"], "is not a directory"),
    (["{empty}"], "cannot open the pool"),
])
def test_export_refuses_bad_input_before_reading(demo, tmp_path, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    values = {"pool": str(demo), "missing": str(tmp_path / "missing"), "empty": str(empty)}
    result = CliRunner().invoke(pool_group, ["export", *[a.format(**values) for a in args]])
    assert result.exit_code == 2 or result.exit_code == 1, result.output
    assert message in result.output


def test_export_to_stdout_from_the_command_line(demo):
    path = demo
    forge = Path(sys.executable).with_name("forge")
    done = subprocess.run([str(forge), "pool", "export", str(path), "--domain", "web"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["session_id"] for line in done.stdout.splitlines()] == ["web-0", "web-1"]
