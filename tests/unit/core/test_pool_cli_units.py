"""``forge pool``: stats, entries and show on a real pool (read-only, while it is open for writing), and errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from forge.checkpoints import ModelNotFound
from forge.pool.cli import pool_group

from helpers.pool_util import cli_pool


@pytest.fixture
def pool(tmp_path):
    with cli_pool(tmp_path / "pool") as opened:
        yield opened


def run(*args: str):
    result = CliRunner().invoke(pool_group, list(args), catch_exceptions=False)
    return result


def test_stats(pool):
    result = run("stats", str(pool.path))
    assert result.exit_code == 0, result.output
    assert "head 0  tail 2" in result.output and "1 pending  1 completed" in result.output
    figures = json.loads(run("stats", str(pool.path), "--json").output)
    assert figures["calls"] == 3 and figures["sessions_open"] == 1 and figures["bytes_on_disk"] > 0


def test_entries_marks_what_a_fetch_with_the_window_returns(pool):
    result = run("entries", str(pool.path), "--window", "1")
    assert result.exit_code == 0, result.output
    assert "window 1: positions 0-0" in result.output and "<- fetch" in result.output
    assert "pending" not in result.output                # position 1 is outside the window
    rows = json.loads(run("entries", str(pool.path), "--json").output)["entries"]
    assert [(r["position"], r["status"], r["closed"]) for r in rows] == [(0, "completed", 2), (1, "pending", 0)]


def test_show_decodes_calls_with_the_tokenizer(pool):
    result = run("show", str(pool.path), "g0", "--model", "tiny")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "What is 12 + 30?" in out and "It is 42." in out and "Yes." in out
    assert "shared with the previous call" in out and " Sure?" in out
    assert "correct=1.0" in out and "process rewards: 0.75" in out and "weight versions 3..3" in out
    assert "It is 42" not in run("show", str(pool.path), "g0", "--ids").output
    data = json.loads(run("show", str(pool.path), "g0", "--json").output)
    assert data["session"]["num_calls"] == 2 and len(data["calls"]) == 2


def test_errors_are_clear(pool, tmp_path):
    result = run("show", str(pool.path), "nope")
    assert result.exit_code == 1 and "unknown session 'nope'" in result.output
    (tmp_path / "empty").mkdir()
    result = run("stats", str(tmp_path / "empty"))
    assert result.exit_code == 1 and "not a pool" in result.output
    result = run("show", str(pool.path), "g0", "--model", str(tmp_path / "empty"))
    assert result.exit_code == 2 and str(ModelNotFound(tmp_path / "empty")) in result.output
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"model_type": "qwen3"}')
    result = run("show", str(pool.path), "g0", "--model", str(config_only))
    assert result.exit_code == 1 and "tokenizer" in result.output


def test_help_texts():
    for command in ("stats", "entries", "show", "serve"):
        result = run(command, "--help")
        assert result.exit_code == 0 and "Usage" in result.output
    assert "--map-size" in run("serve", "--help").output
