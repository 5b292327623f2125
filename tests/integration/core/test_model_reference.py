"""A model reference through the programs: ``forge model generate tiny`` works, and a bad reference reads the same
from every program, refused before anything loads. (Resolving references: unit/test_model_reference.py.)"""

from __future__ import annotations

import subprocess

import pytest

from conftest import script

MESSAGE = ("{} is neither a built-in model ('tiny', 'tiny-moe'), a checkpoint directory (no config.json in it) nor "
           "a Hugging Face model id (org/name or org/name@revision)")


def test_forge_model_generate_tiny():
    result = subprocess.run([script("forge"), "model", "generate", "tiny", "--prompt", "hi", "--max-tokens", "4"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "generated" in result.stderr


@pytest.mark.parametrize("command", [["forge", "model", "info"],
                                     ["forge", "model", "generate", "--prompt", "hi"],
                                     ["forge-actor", "--port", "0", "--model"]])
def test_a_bad_reference_reads_the_same_everywhere(tmp_path, command):
    missing = tmp_path / "nonexistent"
    result = subprocess.run([script(command[0]), *command[1:], str(missing)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert MESSAGE.format(missing) in result.stderr
    assert result.stderr.startswith("Usage:"), result.stderr         # refused before anything loaded or logged
