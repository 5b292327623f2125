"""Small torch engines linked to an L3 cache, for the tests of the cache link and of disaggregated serving: 8-token
blocks, an engine built around a model (helpers.engines.make_model's, say), and what the tests do with it (sample a
prompt, record the logits sampled from, wait for blocks to be published)."""

from __future__ import annotations

import random

import torch

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.actors.engine.l3 import KVConnector
from forge.kv.client import CacheClient
from forge.model import CausalLM
from forge.sampling.params import SamplingParams

from helpers.waiting import WAIT_S, wait_for

BLOCK = 8


def l3_engine(model: CausalLM, cache: str | None = None, speculative: bool = False, version: int = 0,
              fetch: str = "always", model_id: str = "l3-test", **overrides) -> TorchEngine:
    """An engine on ``model`` with 4 MiB of KV and a connector to the cache server at ``cache`` (None: no L3)."""
    config = EngineConfig(kv_cache_bytes=4 * 2**20, block_size=BLOCK, speculative=speculative, model_id=model_id,
                          **overrides)
    engine = TorchEngine(model, config, initial_version=version)
    KVConnector(engine, CacheClient([cache]) if cache else None, fetch=fetch)
    return engine


def record_logits(engine: TorchEngine) -> list[torch.Tensor]:
    """Every logits tensor the engine's runner samples from, in order."""
    seen: list[torch.Tensor] = []
    original = engine.runner._sampling_logprobs

    def spy(logits, params):
        seen.append(logits.detach().clone())
        return original(logits, params)

    engine.runner._sampling_logprobs = spy
    return seen


def generate(engine: TorchEngine, prompt: list[int], tokens: int = 12) -> tuple[list[int], list[float]]:
    ids, logprobs = [], []
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=tokens, ignore_eos=True)
    for chunk in engine.submit(GenerationRequest("", prompt, params)):
        ids += chunk.token_ids
        logprobs += chunk.logprobs
    return ids, logprobs


def wait_published(engine: TorchEngine, count: int, timeout_s: float = WAIT_S) -> None:
    wait_for(lambda: engine.stats()["l3_published_blocks"] >= count, f"{count} blocks published to L3", timeout_s)


def prompt_of(seed: int, length: int = 75) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100) for _ in range(length)]
