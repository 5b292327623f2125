"""The learner's tests' small random model, an engine sampling from a copy of it (and a pool filled by one), and
what learner processes are given and leave: a model and a pool of rollouts written for them, and the positions
each step trained."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.model import CausalLM, ModelConfig
from forge.pool import Pool

from helpers.random_model import EXPERTS, copy_of, random_model, small_config
from helpers.rollouts import fill_pool

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


def lineage(metrics: Path) -> dict[int, list[int]]:
    """The positions trained by each step of the final lineage (a redone step's last record wins)."""
    steps: dict[int, list[int]] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["positions"]
    return steps
