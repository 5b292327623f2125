"""Attention backends: the model computes q, k and v of each layer and hands them to a backend, which decides
which keys every query sees and where keys and values live.

This is the attention specification of the model. ``CausalAttention`` is the plain case; ``MaskedAttention`` runs
packed sequences and prefix trees (each token attends to an explicit set, e.g. its ancestors); ``DenseKVCache``
keeps keys and values across calls for incremental decoding. The actor engine supplies its own paged backend through
the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor


class AttentionBackend(ABC):
    """Computes attention for one layer: ``q`` is [B, Hq, T, D], ``k`` and ``v`` are [B, Hkv, T, D] (already
    normalised and rotated); the result is [B, Hq, T, D]."""

    @abstractmethod
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor: ...

    def attend_windowed(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None = None,
                        softcap: float | None = None) -> Tensor:
        """``attend`` where each query sees only keys less than ``window`` positions back, and scores are
        soft-capped at ``softcap`` (None: no limit). Backends that cannot refuse both."""
        if window is None and softcap is None:
            return self.attend(layer, q, k, v, scale)
        raise ValueError(f"{type(self).__name__} has no sliding-window or soft-capped attention")


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor,
                     softcap: float | None = None) -> Tensor:
    """Attention under a bool ``mask`` ([Q, K] or broadcastable to [B, H, Q, K]); with ``softcap``, the scores are
    soft-capped before the mask, as the families that cap them compute it (scores in full, softmax in float32)."""
    if softcap is None:
        return _sdpa(q, k, v, scale, mask=mask)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.tanh(torch.matmul(q, k.transpose(-2, -1)) * scale / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), v)


def window_mask(query_positions: Tensor, key_positions: Tensor, window: int) -> Tensor:
    """[Q, K] bool: key less than ``window`` positions before the query."""
    return query_positions.unsqueeze(-1) - key_positions.unsqueeze(0) < window


class CausalAttention(AttentionBackend):
    """Every token attends to itself and all earlier tokens of its row."""

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        return _sdpa(q, k, v, scale, causal=q.shape[2] > 1)

    def attend_windowed(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None = None,
                        softcap: float | None = None) -> Tensor:
        if window is None and softcap is None:
            return self.attend(layer, q, k, v, scale)
        positions = torch.arange(q.shape[2], device=q.device)
        mask = positions.unsqueeze(-1) >= positions.unsqueeze(0)
        if window is not None:
            mask &= window_mask(positions, positions, window)
        return masked_attention(q, k, v, scale, mask, softcap)


class MaskedAttention(AttentionBackend):
    """Every token attends exactly to the keys its row of ``mask`` allows (``mask[b, i, j]`` True: query i sees
    key j). Every row must allow at least one key (normally the token itself)."""

    def __init__(self, mask: Tensor) -> None:
        if mask.dtype != torch.bool or mask.dim() not in (2, 3) or mask.shape[-1] != mask.shape[-2]:
            raise ValueError(f"mask must be a bool [T, T] or [B, T, T] tensor, got {mask.dtype} {tuple(mask.shape)}")
        if not bool(mask.any(dim=-1).all()):
            raise ValueError("every query must attend to at least one key")
        self.mask = mask if mask.dim() == 3 else mask.unsqueeze(0)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        return _sdpa(q, k, v, scale, mask=self.mask.unsqueeze(1))

    @classmethod
    def from_parents(cls, parents: Tensor) -> MaskedAttention:
        """A prefix tree in depth-first order: ``parents[i]`` is the index of token i's parent (-1 for a root), and
        every parent comes before its children. Each token attends to its ancestors and itself."""
        return cls(ancestor_mask(parents))

    @classmethod
    def from_segments(cls, segment_ids: Tensor) -> MaskedAttention:
        """Several sequences packed in one row ([T] or [B, T] segment ids): causal attention within each segment."""
        seg = segment_ids if segment_ids.dim() == 2 else segment_ids.unsqueeze(0)
        length = seg.shape[-1]
        causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
        return cls((seg.unsqueeze(-1) == seg.unsqueeze(-2)) & causal)


def ancestor_mask(parents: Tensor) -> Tensor:
    """[T, T] bool mask of ancestors-or-self for a tree given by parent indices in depth-first order."""
    parents = parents.tolist() if isinstance(parents, Tensor) else list(parents)
    size = len(parents)
    mask = torch.zeros(size, size, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(f"token {i} has parent {parent}: parents must come before their children")
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask


class DenseKVCache(AttentionBackend):
    """Contiguous per-layer key/value cache for incremental decoding of a batch of equal-length rows.

    Call the model with the new tokens only (and their position ids); their keys and values are appended and each
    new query attends causally to everything cached so far. Used by the reference decoder and tests; the actor
    engine uses a paged cache instead."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        new, total = q.shape[2], k.shape[2]
        if new == 1:
            return _sdpa(q, k, v, scale)
        mask = torch.ones(new, total, dtype=torch.bool, device=q.device).tril(diagonal=total - new)
        return _sdpa(q, k, v, scale, mask=mask)
