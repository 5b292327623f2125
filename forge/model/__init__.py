"""The shared model: the Qwen3-family transformer with MTP, its configuration, checkpoints and attention backends."""

from forge.model.attention import AttentionBackend, CausalAttention, DenseKVCache, MaskedAttention
from forge.model.checkpoint import CheckpointError
from forge.model.config import SUPPORTED_MODEL_TYPES, ModelConfig, ModelConfigError
from forge.model.qwen3 import CausalLM

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "AttentionBackend",
    "CausalAttention",
    "CausalLM",
    "CheckpointError",
    "DenseKVCache",
    "MaskedAttention",
    "ModelConfig",
    "ModelConfigError",
]
