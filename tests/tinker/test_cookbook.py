"""tinker-cookbook recipes, unchanged, against forge-tinker on a real actor: its RL math recipe on the arithmetic
environment it generates in code (renderer role_colon, loss importance_sampling, groups sampled on the actor), and a
supervised run on the conversations file the cookbook ships. Each runs a few steps offline and logs what the
cookbook logs; the supervised loss falls."""

from __future__ import annotations

import json

import pytest

from helpers.tinker_stack import tinker_stack

pytestmark = pytest.mark.tinker
RL_STEPS, SL_STEPS = 3, 6


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with tinker_stack(tmp_path_factory.mktemp("tinker-cookbook")) as running:
        yield running


def test_the_rl_math_recipe_trains_on_arithmetic(stack):
    log_dir = stack.directory / "math-rl"
    stack.python("-m", "tinker_cookbook.recipes.math_rl.train", f"model_name={stack.base_model}",
                 "renderer_name=role_colon", "env=arithmetic", "group_size=4", "groups_per_batch=2", "max_tokens=5",
                 f"max_steps={RL_STEPS}", "lora_rank=8", "learning_rate=1e-3", "loss_fn=importance_sampling",
                 f"log_path={log_dir}", f"base_url={stack.base_url}", "behavior_if_log_dir_exists=delete",
                 "eval_every=0", "save_every=0")
    metrics = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "env/all/reward/total" in m]
    assert [m["step"] for m in steps] == list(range(RL_STEPS))
    for m in steps:
        assert m["env/all/ac_tokens_per_turn"] > 0              # each group's completions were sampled
    assert stack.server.alive and stack.actor.alive


def test_a_supervised_run_on_the_cookbooks_conversations_learns(stack):
    seen = stack.run("cookbook_sl.py", stack.base_model, str(stack.directory / "sl"), str(SL_STEPS))
    nll = [m["train_mean_nll"] for m in seen["metrics"] if "train_mean_nll" in m]
    assert len(nll) == SL_STEPS and nll[-1] < nll[0]
    assert [c["name"] for c in seen["checkpoints"]][-1] == "final"
    assert all(c["state_path"].startswith("tinker://") for c in seen["checkpoints"])
