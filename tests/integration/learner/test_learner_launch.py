"""The learner's several-process launches as a user starts them, on the built-in tiny model: ``forge-learner --nproc 2
--context-parallel 2``, the same through ``forge learner``, and two nodes of two processes with ``--context-parallel
4`` each train the steps one process trains (loss and weights within 1e-4), their trees' stems split across the
ranks; and forge up's learner with ``nproc = 2`` and ``context_parallel = 2`` trains. (The steps' equality inside
one torchrun job, helper-driven: test_context_parallel.py and test_learner.py.)"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from forge.app.up.config import UpConfig
from forge.app.up.run import run
from forge.checkpoints import TINY_DIR, load_model
from forge.learner.checkpoint import Checkpointer

from conftest import free_port, script
from helpers.learner_runs import write_tiny_pool

STEPS = 2
HOSTS = ("127.0.0.2", "127.0.0.3")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200),    # torchrun jobs of 2 and 4 ranks: minutes when loaded
              pytest.mark.xdist_group("serial")]  # one at a time (conftest.SERIAL)


def learner_args(pool: Path, run_dir: Path, *extra: str) -> list[str]:
    """Two steps of two groups each on the tiny model, trees cut at 32 tokens so that each step has a stem."""
    return ["--pool", str(pool), "--run-dir", str(run_dir), "--model", "tiny", "--no-publish", "--device", "cpu",
            "--batch-groups", "2", "--window", "4", "--lr", "1e-3", "--micro-batch-tokens", "32", "--max-steps",
            str(STEPS), *extra]


def pool_copy(source: Path, run_dir: Path) -> Path:
    """A copy of the pool ``source`` for one run (training consumes its entries)."""
    return Path(shutil.copytree(source, run_dir.parent / f"{run_dir.name}-pool"))


def finished(process: subprocess.Popen) -> str:
    """``process``'s output once it exited 0 (the bound only guards against a hang)."""
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-4000:]
    return output


def trained(run_dir: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The run's step records, and the weights of its last checkpoint."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    latest = Checkpointer(run_dir / "checkpoints").latest()
    assert latest is not None and latest.state["step"] == STEPS
    return records, load_file(latest.model_dir / "model.safetensors")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[Path, tuple[list[dict], dict[str, torch.Tensor]]]:
    """(a pool of 4 groups of two-call sessions sampled from the tiny model, what one learner process trains on a
    copy of it: weights moved well beyond the tolerance the launches below are held to)."""
    base = tmp_path_factory.mktemp("launch")
    write_tiny_pool(base / "pool", groups=4, calls=2)
    run_dir = base / "one"
    finished(subprocess.Popen([script("forge-learner"), *learner_args(pool_copy(base / "pool", run_dir), run_dir)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    records, weights = trained(run_dir)
    initial = load_model("tiny")[0].state_dict()
    assert max(float((weights[name].float() - initial[name].float()).abs().max()) for name in weights) > 1e-3
    return base / "pool", (records, weights)


def assert_steps_as_one_process(one: tuple[list[dict], dict], other: tuple[list[dict], dict], ranks: int) -> None:
    """The same entries, losses and final weights within 1e-4 (the second step's loss is taken at the weights the
    first step made), and every stem split across ``ranks`` ranks."""
    (records, weights), (their_records, their_weights) = one, other
    assert [r["step"] for r in their_records] == list(range(1, STEPS + 1))
    for mine, theirs in zip(records, their_records, strict=True):
        assert theirs["positions"] == mine["positions"]
        assert theirs["loss"] == pytest.approx(mine["loss"], abs=1e-4)
        assert theirs["stem_tokens"] == mine["stem_tokens"] >= 2 * ranks
        assert theirs["stem_rank_tokens"] <= -(-mine["stem_tokens"] // ranks) + 1 < mine["stem_tokens"]
    assert their_weights.keys() == weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(their_weights[name], tensor, atol=1e-4, rtol=0, msg=name)


@pytest.mark.parametrize("program", [("forge-learner",), ("forge", "learner")], ids=["script", "subcommand"])
def test_two_processes_of_one_context_group_step_as_one_process(one_process, tmp_path, program):
    pool, one = one_process
    run_dir = tmp_path / "run"
    args = learner_args(pool_copy(pool, run_dir), run_dir, "--nproc", "2", "--context-parallel", "2")
    finished(subprocess.Popen([script(program[0]), *program[1:], *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True))
    assert_steps_as_one_process(one, trained(run_dir), ranks=2)


def test_two_nodes_of_two_processes_in_one_context_group_step_as_one_process(one_process, tmp_path):
    """Each node runs the same command with its own --node-rank and address, as docs/learner.md shows."""
    pool, one = one_process
    run_dir = tmp_path / "run"
    args = learner_args(pool_copy(pool, run_dir), run_dir, "--nproc", "2", "--context-parallel", "4", "--nnodes",
                        "2", "--rdzv-endpoint", f"{HOSTS[0]}:{free_port(HOSTS[0])}")
    nodes = [subprocess.Popen([script("forge-learner"), *args, "--node-rank", str(rank), "--host", HOSTS[rank]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for rank in (0, 1)]
    try:
        for node in nodes:
            finished(node)
    finally:
        for node in nodes:
            if node.poll() is None:         # its peer failed: the job cannot go on
                node.kill()
    assert_steps_as_one_process(one, trained(run_dir), ranks=4)


@pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")),
                    reason="the pre-trained tiny checkpoint is not in forge/assets/tiny")
def test_forge_up_runs_its_learner_as_two_processes_of_one_context_group(tmp_path):
    """forge up gives its learner --nproc 2 --context-parallel 2 (from [learner]): the learner trains its steps,
    their stems split across the two ranks (trees cut at 16 tokens, so that each step has one)."""
    config = UpConfig(run_dir=tmp_path / "run", minutes=20.0, steps=STEPS, eval_size=8, eval_samples=1).with_services(
        learner={"nproc": 2, "context_parallel": 2, "micro_batch_tokens": 16, "device": "cpu"})
    result = asyncio.run(run(config, Console(record=True, width=120)))
    assert result["learner"].get("step", 0) >= STEPS
    records = [json.loads(line) for line in (config.run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    split = [r for r in records if r["stem_rank_tokens"] < r["stem_tokens"]]
    assert split and all(r["stem_rank_tokens"] <= -(-r["stem_tokens"] // 2) + 1 for r in records), records
