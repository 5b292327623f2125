"""Random-weight checkpoints of model families Forge does not implement, written by transformers: small configs
that keep each family's quirks (sliding windows, soft-capping, tied heads, partial RoPE)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

SMALL = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# A shape vLLM's CPU attention serves (head size 32).
SERVABLE = {**SMALL, "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "max_position_embeddings": 512}
FAMILIES = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2Config, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": 4}),
    "gemma2": (transformers.Gemma2Config, {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 30.0,
                                           "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 8}),
    "gemma3_text": (transformers.Gemma3TextConfig, {"head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8}),
    "phi3": (transformers.Phi3Config, {}),
    "olmo2": (transformers.Olmo2Config, {}),
    "glm4": (transformers.Glm4Config, {"head_dim": 8}),
    "smollm3": (transformers.SmolLM3Config, {}),
}


def write_family(directory: Path, family: str, seed: int = 0, shape: dict | None = None, **overrides):
    """(directory, the transformers model) of a random ``family`` checkpoint written there."""
    config_class, quirks = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_class(**{**(shape or SMALL), **quirks, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.save_pretrained(directory)
    return directory, model.eval()
