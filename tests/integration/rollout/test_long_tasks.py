"""The long tasks in the main job: ``forge up --domains long`` rolls out agent sessions whose lookups answer with long
pages of records, the gateway records their calls (the pages in the prompts, token-in-token-out) and the learner
trains on them; the held-out reward of the long domain is read at the start and the end."""

from __future__ import annotations

import json
import re

import pytest

from forge.checkpoints import load_tokenizer
from forge.v1 import pool_pb2

from helpers import short_runs
from helpers.short_runs import stored_sessions

PAGE_LINES = 30
RECORD = re.compile(r"^(?:The|[A-Z][a-z]+'s) [a-z]+ is [a-z]+\.$", re.MULTILINE)
pytestmark = pytest.mark.xdist_group("serial")  # forge up runs: one at a time (conftest.SERIAL)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_forge_up_trains_on_long_tasks(tmp_path):
    result = short_runs.forge_up(tmp_path, "", args=("--domains", "long", "--long-page-lines", str(PAGE_LINES),
                                                      "--eval-size", "4"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["learner"]["step"] >= 2 and summary["domains"] == ["long"]
    assert set(summary["eval_end"]) == {"long"}
    sessions = [s for s in stored_sessions(tmp_path / "run" / "pool")
                if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert sessions and all(s.session.domain == "long" for s in sessions)
    tokenizer = load_tokenizer("tiny")
    first = tokenizer.decode(list(sessions[0].calls[0].prompt_ids))
    assert "The records that mention a key." in first, "the long tasks' tool offered"
    followed = [tokenizer.decode(list(c.prompt_ids)) for s in sessions for c in s.calls[1:]]
    paged = [text for text in followed if len(RECORD.findall(text)) >= PAGE_LINES]
    assert paged, "a whole page of records went back to the model"
