"""A plain reference decoder (one sequence, dense KV cache): the model's own sampling loop, used by
``forge model generate`` and as the reference the actor engine is tested against."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge.model.attention import DenseKVCache
from forge.model.qwen3 import CausalLM
from forge.sampling.params import SamplingParams
from forge.sampling.sampling import sample, sampling_logprobs


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str        # "stop" or "length"


@torch.inference_mode()
def generate(model: CausalLM, prompt_ids: list[int], params: SamplingParams) -> Generation:
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    config = model.config
    limit = config.max_position_embeddings - len(prompt_ids)
    if limit <= 0:
        raise ValueError(f"the prompt ({len(prompt_ids)} tokens) fills the context ({config.max_position_embeddings})")
    max_tokens = min(params.max_tokens or limit, limit)
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(config.eos_token_ids))
    device = model.output_weight.device
    generator = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
    cache = DenseKVCache(config.num_hidden_layers)
    tokens = torch.tensor([prompt_ids], device=device)
    positions = torch.arange(len(prompt_ids), device=device).unsqueeze(0)
    out = Generation([], [], "length")
    for _ in range(max_tokens):
        hidden = model(tokens, positions, cache)
        logprobs = sampling_logprobs(model.logits(hidden[:, -1]), params.temperature, params.top_k, params.top_p)
        token, logprob = sample(logprobs, params.greedy, generator)
        out.token_ids.append(int(token))
        out.logprobs.append(float(logprob))
        if out.token_ids[-1] in stops:
            out.finish_reason = "stop"
            break
        tokens = token.view(1, 1)
        positions = positions[:, -1:] + 1
    return out
