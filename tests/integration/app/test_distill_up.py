"""On-policy distillation through ``forge up``: ``[learner] teacher`` names a checkpoint of the student's tokenizer
(the built-in tiny model with its weights moved away); forge up starts an actor serving it before the learner, which
asks it for the log-probs of every sampled completion of the run's rollouts, reports the reverse KL per domain each
step, and stops with the run. (That the KL falls: ``tests/integration/learner/test_distill_on_policy.py``.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import script
from helpers.random_model import perturbed_tiny

pytestmark = pytest.mark.timeout(600)

RUN = """
[model]
path = "tiny"

[up]
minutes = 20
steps = 4
eval_samples = 1
eval_size = 2
groups_in_flight = 4
max_tokens = 48
cache = false

[learner]
batch_groups = 2
lr = 3e-4
warmup_steps = 0
teacher = "{teacher}"
"""


def test_forge_up_starts_the_teacher_s_actor_and_the_learner_distils(tmp_path):
    teacher_dir = perturbed_tiny(tmp_path / "teacher")
    (tmp_path / "run.toml").write_text(RUN.format(teacher=teacher_dir))
    done = subprocess.run([script("forge"), "up", "--config", str(tmp_path / "run.toml"), "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=1100, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    services = {s["name"]: s for s in json.loads((tmp_path / "run" / "services.json").read_text())}
    assert services["teacher-0"]["kind"] == "actor"
    records = [json.loads(line) for line in (tmp_path / "run" / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all("distill_kl" in r and "teacher_s" in r for r in records)
    assert {"distill_kl/reasoning", "distill_kl/qa"} <= set().union(*records)
    assert (tmp_path / "run" / "logs" / "teacher-0.log").exists()
    # --steps 4: the learner stops at step 4 itself, and the run ends with it
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["learner"]["step"] == 4
