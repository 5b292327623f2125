"""``forge model check``: the built-in model and a family trained through transformers pass (exit 0, one JSON object
with ok and the log-prob gap); a family nothing implements is refused in one line (exit 1); a training path that
computes other log-probs than transformers fails the check."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from click.testing import CliRunner

from forge.app.model_check import CheckConfig, _logprob_gap, check_command
from forge.checkpoints import load_model, resolve_model

from conftest import script
from helpers.families import FAMILIES, with_tiny_tokenizer, write_family
from helpers.forge_many import forge_commands


def check(model: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([script("forge"), "model", "check", model, *extra], capture_output=True, text=True,
                          timeout=600)


def test_the_built_in_model_and_a_transformers_family_pass(tmp_path):
    """The three commands run as the program runs them, one after another in one process (forge_many): the
    program's imports are paid once."""
    directory = with_tiny_tokenizer(write_family(tmp_path / "llama", "llama")[0])
    native, family, text = forge_commands([(["model", "check", "tiny", "--json"], tmp_path),
                                           (["model", "check", str(directory), "--json"], tmp_path),
                                           (["model", "check", str(directory)], tmp_path)])
    assert native.returncode == 0, native.stderr[-2000:]
    report = json.loads(native.stdout)
    assert report["ok"] and report["training_path"] == "forge" and report["tree_max_abs_diff"] < 1e-4
    assert report["logprob_max_abs_diff"] < 1e-4 and report["tool_parser"].startswith("hermes")

    assert family.returncode == 0, family.stderr[-2000:]
    report = json.loads(family.stdout)
    assert report["ok"] and report["training_path"] == "transformers" and report["tree_max_abs_diff"] < 1e-5
    assert report["logprob_max_abs_diff"] <= 1e-5 and report["model_type"] == "llama"
    assert not any("torch" in backend for backend in report["backends"])
    assert text.returncode == 0 and text.stdout.splitlines()[-1] == "ok"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_passes(tmp_path, family):
    """The command's own code in this process (one process per family would spend its time importing)."""
    directory = with_tiny_tokenizer(write_family(tmp_path / family, family)[0])
    result = CliRunner().invoke(check_command, [str(directory), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["model_type"] == FAMILIES[family][0].model_type
    assert report["logprob_max_abs_diff"] <= 1e-5 and report["tree_max_abs_diff"] <= 1e-5


def test_a_family_nothing_implements_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "not_a_family"}')
    result = check(str(tmp_path))
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 1 and len(errors) == 1 and "implemented neither by Forge" in errors[0]
    assert "Traceback" not in result.stderr


def test_a_training_path_that_differs_from_transformers_is_caught(tmp_path):
    directory, _model = write_family(tmp_path / "qwen2", "qwen2")
    policy, ref = load_model(directory)
    assert _logprob_gap(resolve_model(directory), policy.eval(), CheckConfig(model=str(directory))) <= 1e-5
    with torch.no_grad():
        policy.model.norm.weight.mul_(1.5)          # a norm read wrongly, as a port could
    assert _logprob_gap(ref, policy, CheckConfig(model=str(directory))) > 1e-2
