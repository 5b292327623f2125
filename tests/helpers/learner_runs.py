"""The learner's tests' small random model, an engine sampling from a copy of it, and what learner processes are
given and leave: a model and a pool of rollouts written for them, and the positions each step trained."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.model import CausalLM, ModelConfig
from forge.pool import Pool

from helpers.rollouts import fill_pool

CONFIG = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_nextn_predict_layers=1,
                     max_position_embeddings=256)
MOE_CONFIG = dataclasses.replace(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


def make_model(seed: int = 0, config: ModelConfig = CONFIG) -> CausalLM:
    model = CausalLM(config)
    model.init_weights(std=0.2, seed=seed)
    return model


def engine_of(model: CausalLM, **overrides) -> TorchEngine:
    copy = make_model(config=model.config)
    copy.load_state_dict(model.state_dict())
    return TorchEngine(copy, EngineConfig(kv_cache_bytes=4 * 2**20, block_size=8, **overrides))


def write_model_and_pool(directory: Path, seed: int, groups: int) -> None:
    """A random model in DIRECTORY/model and a pool in DIRECTORY/pool of ``groups`` finished groups of 2 rollouts
    sampled from it, for the learner processes of a test."""
    model = make_model(seed)
    model.save_pretrained(directory / "model")
    engine = engine_of(model)
    pool = Pool(directory / "pool")
    fill_pool(pool, engine, groups=groups, group_size=2, vocab=64)
    engine.close()
    pool.close()


def lineage(metrics: Path) -> dict[int, list[int]]:
    """The positions trained by each step of the final lineage (a redone step's last record wins)."""
    steps: dict[int, list[int]] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["positions"]
    return steps
