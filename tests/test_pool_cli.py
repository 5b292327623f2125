"""``forge pool``: stats, entries and show on a real pool (read-only, while it is open for writing), and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from forge.assets import TINY_DIR
from forge.builtin import ModelNotFound
from forge.pool import Pool
from forge.pool.cli import pool_group
from forge.tokenizer import Tokenizer
from forge.v1 import pool_pb2

from helpers.pool_util import make_call


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_dir(TINY_DIR)


@pytest.fixture
def pool(tmp_path, tokenizer):
    with Pool(tmp_path / "pool") as opened:
        group = [opened.open_session(session_id=f"g{i}", task_id="sum", group_id="g", group_size=2) for i in range(2)]
        prompt, answer = tokenizer.encode("What is 12 + 30?"), tokenizer.encode("It is 42.")
        opened.append_call(pool_pb2.CallRecord(session_id="g0", index=0, prompt_ids=prompt, completion_ids=answer,
                                               logprobs=[-0.5] * len(answer), weight_versions=[3] * len(answer),
                                               actor="actor-0"))
        follow, completion = prompt + answer + tokenizer.encode(" Sure?"), tokenizer.encode("Yes.")
        opened.append_call(pool_pb2.CallRecord(session_id="g0", index=1, prompt_ids=follow, completion_ids=completion,
                                               logprobs=[-0.1] * len(completion), weight_versions=[4] * len(completion)))
        opened.append_call(make_call("g1", 0))
        opened.add_process_reward("g0", 1, 0.75)
        for session in group:
            opened.close_session(session_id=session.session_id, outcome_rewards={"correct": 1.0})
        opened.open_session(session_id="later")
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


def test_stats_from_another_process_while_the_pool_is_open(pool):
    code = "from forge.pool.cli import pool_group; pool_group()"
    result = subprocess.run([sys.executable, "-c", code, "stats", str(pool.path), "--json"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tail"] == 2


def test_help_texts():
    for command in ("stats", "entries", "show", "serve"):
        result = run(command, "--help")
        assert result.exit_code == 0 and "Usage" in result.output
    assert "--map-size" in run("serve", "--help").output
