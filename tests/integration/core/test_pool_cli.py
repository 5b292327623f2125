"""``forge pool stats`` from another process while the pool is open for writing. (The commands in process:
unit/test_pool_cli.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.pool_util import cli_pool


@pytest.fixture
def pool(tmp_path):
    with cli_pool(tmp_path / "pool") as opened:
        yield opened


def test_stats_from_another_process_while_the_pool_is_open(pool):
    code = "from forge.pool.cli import pool_group; pool_group()"
    result = subprocess.run([sys.executable, "-c", code, "stats", str(pool.path), "--json"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tail"] == 2
