"""The embedded torch engine in tests: small random models (dense, and with experts), an engine on one, a request run
to its end, and the checks several engine tests make (concurrent greedy requests against a reference, recorded
log-probs against a full forward pass)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import torch

from forge.actors.backend import FinishReason, GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.model import CausalLM, ModelConfig
from forge.sampling.params import SamplingParams
from forge.sampling.sampling import sampling_logprobs

from helpers.random_model import random_model, small_config

CONFIG = small_config(max_position_embeddings=512, eos_token_id=100)
MOE_CONFIG = small_config(experts=True, num_hidden_layers=3, max_position_embeddings=512, eos_token_id=100,
                          num_experts=5, mlp_only_layers=(1,))


def make_model(seed: int, config: ModelConfig = CONFIG) -> CausalLM:
    """The engine tests' random model (``CONFIG`` unless told) for ``seed``."""
    return random_model(config, seed, std=0.15)


def moe_model() -> CausalLM:
    """A model with experts whose routers differ from token to token."""
    return random_model(MOE_CONFIG, std=0.15, router_scale=8.0)


def transformers_reference(directory: Path, model: CausalLM):
    """transformers' Qwen3ForCausalLM (Qwen3MoeForCausalLM for a model with experts) on ``model``'s weights, written
    to ``directory``; the test is skipped where transformers is not installed."""
    transformers = pytest.importorskip("transformers")
    model.save_pretrained(directory)
    reference = transformers.Qwen3MoeForCausalLM if model.config.is_moe else transformers.Qwen3ForCausalLM
    return reference.from_pretrained(directory, dtype=torch.float32).eval()


def run(engine: TorchEngine, prompt: list[int], params: SamplingParams, request_id: str = ""):
    tokens, logprobs, versions, last = [], [], [], None
    for chunk in engine.submit(GenerationRequest(request_id, prompt, params)):
        tokens += chunk.token_ids
        logprobs += chunk.logprobs
        versions += chunk.weight_versions
        last = chunk
    return tokens, logprobs, versions, last


def full_forward_logprobs(model: CausalLM, prompt: list[int], tokens: list[int], params: SamplingParams):
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([prompt + tokens])))[0, len(prompt) - 1:-1]
    chosen = sampling_logprobs(logits, params.temperature, params.top_k, params.top_p)
    return chosen.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def engine_for(model: CausalLM, **overrides) -> TorchEngine:
    defaults = dict(kv_cache_bytes=8 * 2**20, block_size=8)
    return TorchEngine(model, EngineConfig(**{**defaults, **overrides}))


def assert_concurrent_greedy_equals(engine: TorchEngine, reference, prompts: list[list[int]], new_tokens: int) -> None:
    """Greedy requests sent to ``engine`` at once from threads each get what ``reference.generate`` gives alone."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(engine, prompts[i], params)[0]))
               for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                      do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert results[i] == expected, f"request {i}"


def assert_logprobs_equal_a_full_forward_pass(model: CausalLM, params: SamplingParams, **engine) -> None:
    """One 45-token prompt sampled twice (the second time from its cached blocks): every recorded log-prob equals a
    full forward pass's (24 new tokens each)."""
    served = engine_for(model, **engine)
    prompt = [random.Random(7).randrange(100) for _ in range(45)]
    try:
        for attempt in range(2):
            tokens, logprobs, _, last = run(served, prompt, params)
            assert len(tokens) == 24 and last.finish_reason is FinishReason.LENGTH
            expected = full_forward_logprobs(model, prompt, tokens, params)
            torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(expected), atol=2e-5, rtol=0)
            if attempt:
                assert served.blocks.hit_tokens >= 40
    finally:
        served.close()
