"""The CLI programs: parts not built yet say so and exit non-zero, bad input is refused before anything loads, and
the model commands work end to end. (Option precedence: unit/test_cli.py.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from forge.checkpoints import ModelNotFound

from conftest import script


def test_model_init_info_and_generate(tmp_path):
    out = tmp_path / "tiny"
    subprocess.run([script("forge"), "model", "init", str(out), "--seed", "3"], check=True, timeout=120)
    info = json.loads(subprocess.run([script("forge"), "model", "info", str(out), "--json"], check=True,
                                     capture_output=True, text=True, timeout=120).stdout)
    assert info["has_weights"] and info["num_nextn_predict_layers"] == 1 and info["parameters"] > 1e6
    result = subprocess.run([script("forge"), "model", "generate", str(out), "--prompt", "Compute 2 + 3.",
                             "--max-tokens", "5", "--temperature", "0.8", "--seed", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "5 generated" in result.stderr or "finish: stop" in result.stderr


@pytest.mark.parametrize("command", [["forge-actor", "--in-process", "--port", "0", "--model"],
                                     ["forge-actor", "--port", "0", "--model"],
                                     ["forge", "model", "info"],
                                     ["forge", "model", "eval"]])
def test_a_model_that_is_no_checkpoint_is_a_usage_error(tmp_path, command):
    result = subprocess.run([script(command[0]), *command[1:], str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert str(ModelNotFound(tmp_path)) in result.stderr


@pytest.mark.parametrize("mode", ["--in-process", "--engine-process"])
def test_an_empty_l3_server_list_is_a_usage_error(mode):
    result = subprocess.run([script("forge-actor"), mode, "--port", "0", "--l3-cache", ","],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Invalid value for '--l3-cache'" in result.stderr, result.stderr
    assert "no cache server addresses given" in result.stderr


def bare_checkpoint(directory, model_type: str = "llama"):
    """A checkpoint directory with nothing but a config.json naming ``model_type``."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 64}))
    return directory


@pytest.mark.parametrize("command, model_type, says", [
    (["forge-actor", "--port", "0", "--backend", "torch"], "llama", "is 'llama': serve it with --backend vllm"),
    (["forge-actor", "--port", "0"], "llama", "--backend auto picked vllm (the embedded engine does not implement "
                                              "llama): vLLM is not installed"),
    (["forge-learner", "--pool", "{tmp}/pool", "--create-pool"], "llama", "it holds no weights"),
    (["forge-learner", "--pool", "{tmp}/pool", "--create-pool"], "not_a_family", "implemented neither by Forge"),
    (["forge-gateway", "--actor", "127.0.0.1:1", "--pool", "{tmp}/pool"], "llama", "no tokenizer.json"),
    (["forge", "up", "--run-dir", "{tmp}/run"], "llama", "it holds no weights")])
def test_a_model_a_service_cannot_run_is_refused_in_one_line_before_loading(tmp_path, command, model_type, says):
    model = bare_checkpoint(tmp_path / "model", model_type)
    program, *args = [a.format(tmp=tmp_path) for a in command]
    result = subprocess.run([script(program), *args, "--model", str(model)], capture_output=True, text=True,
                            timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode in (1, 2) and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert says in errors[0], errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], "nothing was started"


def test_the_learner_refuses_a_pool_path_that_holds_no_pool(tmp_path):
    mistyped = tmp_path / "poool"
    result = subprocess.run([script("forge-learner"), "--pool", str(mistyped), "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{mistyped} holds no pool (no data.mdb)" in errors[0] and "--create-pool" in errors[0]
    assert not mistyped.exists() and not (tmp_path / "run").exists()


def test_forge_up_refuses_a_run_file_that_sets_the_keys_it_generates(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('[gateway]\napi_key = ["mine"]\n\n[actor]\napi_key_file = "actor.key"\n')
    env = {**os.environ, "FORGE_CACHE_API_KEYS": "mine too"}
    result = subprocess.run([script("forge"), "up", "--config", str(run_file), "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "forge up generates the run's keys" in result.stderr and "[gateway] api_key," in result.stderr
    assert "[actor] api_key_file" in result.stderr and "FORGE_CACHE_API_KEYS" in result.stderr
    assert "--no-keys" in result.stderr and "mine" not in result.stderr
    assert not (tmp_path / "run").exists()
