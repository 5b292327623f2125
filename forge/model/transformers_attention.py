"""Forge's attention backends inside transformers models: the attention function a transformers policy runs.

transformers lets a model's attention be any function registered under a name (``AttentionInterface``); every
family's attention module computes its queries, keys and values (projected, normed and rotated its own way) and hands
them to that function with what the layer needs (its scale, sliding window, soft cap). Registered as ``forge``, the
function hands them in turn to the ``AttentionBackend`` passed down the forward call (``forge_backend=``): the
learner's tree attention, so prefix-tree merging and the step's stem reach every family, or causal attention when
none is passed. transformers builds no mask for an implementation it does not know, so the backend's mask is the
only one.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from forge.model.attention import AttentionBackend, CausalAttention

NAME = "forge"
_CAUSAL = CausalAttention()


def forge_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                    dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None,
                    softcap: float | None = None, forge_backend: AttentionBackend | None = None,
                    **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function contract: q [B, H, T, D], k and v [B, Hkv, T, D] in, [B, T, H, D] out."""
    if attention_mask is not None:
        raise ValueError("a Forge policy's attention takes no transformers mask: its backend holds the mask")
    if kwargs.get("s_aux") is not None:
        raise ValueError("attention sinks are not supported by Forge's attention backends")
    if dropout:
        raise ValueError("attention dropout would make the learner's log-probs differ from the actors' (load the "
                         "policy with TransformersCausalLM.from_pretrained, which turns dropout off)")
    backend = forge_backend if forge_backend is not None else _CAUSAL
    scale = scaling if scaling is not None else module.head_dim ** -0.5
    out = backend.attend_windowed(module.layer_idx, query, key, value, scale, sliding_window, softcap)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function with transformers (idempotent); the name to load models with."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, forge_attention)
    return NAME


__all__ = ["NAME", "forge_attention", "register"]
