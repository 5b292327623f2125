"""The shared model: the Qwen3-family transformer with MTP, its configuration, checkpoints and attention backends.

The names below are imported when first used, not with the package: ``forge.model.config`` (the configuration, a
plain dataclass) is read by processes that never run the network, such as the gateway, and importing torch for it
would cost each of them seconds of start-up and a few hundred megabytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge.lazy import lazy_exports

if TYPE_CHECKING:
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
__getattr__, __dir__ = lazy_exports(__name__, {
    "AttentionBackend": "attention", "CausalAttention": "attention", "DenseKVCache": "attention",
    "MaskedAttention": "attention", "CheckpointError": "checkpoint", "SUPPORTED_MODEL_TYPES": "config",
    "ModelConfig": "config", "ModelConfigError": "config", "CausalLM": "qwen3",
})
