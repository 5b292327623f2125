"""The shared model: the Qwen3-family transformer with MTP, its configuration, checkpoints and attention backends."""

from forge.model.attention import AttentionBackend, CausalAttention, DenseKVCache, MaskedAttention
from forge.model.checkpoint import CheckpointError, load_pretrained, save_pretrained
from forge.model.config import ModelConfig, ModelConfigError
from forge.model.qwen3 import CausalLM

__all__ = [
    "AttentionBackend",
    "CausalAttention",
    "CausalLM",
    "CheckpointError",
    "DenseKVCache",
    "MaskedAttention",
    "ModelConfig",
    "ModelConfigError",
    "load_pretrained",
    "save_pretrained",
]
