"""The learner's tests' small random model, an engine sampling from a copy of it (and a pool filled by one), and
what learner processes are given and leave: a model and a pool of rollouts written for them, the positions each step
trained, and one step under torchrun (``fsdp_step.py``) with the check that two such steps moved alike."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.checkpoints import load_model
from forge.model import CausalLM, ModelConfig
from forge.pool import Pool

from helpers.random_model import EXPERTS, copy_of, random_model, small_config
from helpers.rollouts import fill_pool

HELPERS = Path(__file__).resolve().parent
CONFIG = small_config(vocab_size=64, hidden_size=48, intermediate_size=96, head_dim=12, max_position_embeddings=256)
MOE_CONFIG = dataclasses.replace(CONFIG, **EXPERTS)


def make_model(seed: int = 0, config: ModelConfig = CONFIG) -> CausalLM:
    return random_model(config, seed, std=0.2)


def engine_of(model: CausalLM, **overrides) -> TorchEngine:
    """An engine sampling from a copy of ``model`` (which a learner may then train)."""
    return TorchEngine(copy_of(model), EngineConfig(kv_cache_bytes=4 * 2**20, block_size=8, **overrides))


def fill_from(pool: Pool, model: CausalLM, **rollouts) -> None:
    """``fill_pool(pool, ...)`` with the rollouts (``rollouts``: its options) that an engine on a copy of ``model``
    samples, over the model's vocabulary."""
    engine = engine_of(model)
    try:
        fill_pool(pool, engine, vocab=model.config.vocab_size, **rollouts)
    finally:
        engine.close()


def write_model_and_pool(directory: Path, seed: int, groups: int) -> None:
    """A random model in DIRECTORY/model and a pool in DIRECTORY/pool of ``groups`` finished groups of 2 rollouts
    sampled from it, for the learner processes of a test."""
    model = make_model(seed)
    model.save_pretrained(directory / "model")
    with Pool(directory / "pool") as pool:
        fill_from(pool, model, groups=groups, group_size=2)


def write_tiny_pool(directory: Path, groups: int, calls: int = 1) -> None:
    """A pool in DIRECTORY of ``groups`` finished groups of 2 sessions of ``calls`` calls each (a call's prompt
    extends the previous call's), sampled from the built-in tiny model, which a learner given ``--model tiny``
    trains."""
    with Pool(directory) as pool:
        fill_from(pool, load_model("tiny")[0], groups=groups, group_size=2, calls=calls)


def lineage(metrics: Path) -> dict[int, list[int]]:
    """The positions trained by each step of the final lineage (a redone step's last record wins)."""
    steps: dict[int, list[int]] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["positions"]
    return steps


@dataclasses.dataclass(frozen=True)
class Step:
    """One training step (``helpers/fsdp_step.py``) of the model in ``model_dir`` on a copy of ``directory/pool``,
    on ``nproc`` ranks, ``context_parallel`` of them to a context group."""
    directory: Path
    model_dir: Path
    nproc: int
    lora_rank: int = 0
    context_parallel: int = 1
    micro_batch_tokens: int = 64
    activation_checkpointing: bool = False
    loss: tuple[tuple[str, Any], ...] = ()      # LossConfig fields of the step's loss (default: CISPO)


def steps(wanted: list[Step], device: str = "cpu") -> list[dict]:
    """What each of ``wanted`` saved (on ``device``: cpu, or cuda with a GPU per rank), read back onto the CPU. The
    steps of one process count run one after another in one torchrun job, so a job starts once per count, not once
    per step."""
    cases = []
    for step in wanted:
        name = (f"{step.nproc}-{step.context_parallel}-{step.lora_rank}-{int(step.activation_checkpointing)}-"
                f"{step.micro_batch_tokens}-{device}" + "".join(f"-{value}" for _, value in step.loss))
        copy = step.directory / f"pool-{name}"
        shutil.copytree(step.directory / "pool", copy)
        cases.append({"model": str(step.model_dir), "pool": str(copy), "out": str(step.directory / f"params-{name}.pt"),
                      "micro_batch_tokens": step.micro_batch_tokens, "lora_rank": step.lora_rank,
                      "context_parallel": step.context_parallel,
                      "activation_checkpointing": step.activation_checkpointing, "loss": dict(step.loss)})
    for nproc in sorted({step.nproc for step in wanted}):
        job = [case for step, case in zip(wanted, cases, strict=True) if step.nproc == nproc]
        listed = Path(job[0]["out"]).with_suffix(".json")
        listed.write_text(json.dumps(job))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   str(HELPERS / "fsdp_step.py"), str(listed), device]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600 * len(job))
        assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(case["out"], map_location="cpu") for case in cases]


def stepped(tmp_path: Path, model_dir: Path, nproc: int, lora_rank: int = 0, context_parallel: int = 1,
            micro_batch_tokens: int = 64, activation_checkpointing: bool = False, device: str = "cpu") -> dict:
    """What one training step on a copy of ``tmp_path/pool`` saved on ``nproc`` ranks (see ``steps``)."""
    return steps([Step(tmp_path, model_dir, nproc, lora_rank, context_parallel, micro_batch_tokens,
                       activation_checkpointing)], device)[0]


def assert_same_update(one: dict, two: dict, name: str, lr: float = 1e-3) -> None:
    """Adam's first update is ±lr, except for a gradient near zero, where it is g / (|g| + eps) · lr and the
    rounding that the gradients' tolerance allows moves it anywhere within ±lr: such elements agree within lr."""
    ours, theirs = one["state"][name], two["state"][name]
    settled = one["grads"][name].abs() > 1e-5 if name in one["grads"] else torch.ones_like(ours, dtype=torch.bool)
    torch.testing.assert_close(theirs[settled], ours[settled], atol=5e-5, rtol=1e-5, msg=name)
    assert (theirs - ours).abs().max() <= 2 * lr, name
