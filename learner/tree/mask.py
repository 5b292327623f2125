"""The tree attention predicate. A tree in pre-order is described by ``end`` alone: key j is an ancestor-or-self of
query i iff j <= i < end[j] (the subtree of j is the index range [j, end[j])). ``key_ok`` optionally excludes keys
(the MTP layer's root slots): such a key is seen by itself only."""

from __future__ import annotations

import torch
from torch import Tensor


def allowed(query: Tensor, key: Tensor, end: Tensor, key_ok: Tensor | None) -> Tensor:
    """Bool mask [len(query), len(key)] of the predicate for node indices ``query`` and ``key``."""
    q, k = query.unsqueeze(-1), key.unsqueeze(0)
    mask = (k <= q) & (q < end[key].unsqueeze(0))
    if key_ok is not None:
        mask &= key_ok[key].unsqueeze(0) | (k == q)
    return mask


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where ``mask`` allows, -inf elsewhere (kept once and shared by every layer, unlike a bool mask, which
    attention converts, and keeps for backward, in every call)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def strict_ancestors(end: Tensor, key_ok: Tensor | None, starts: Tensor) -> Tensor:
    """[len(starts), T] bool: the strict ancestors a of each node s (a < s < end[a]) that may be attended to."""
    nodes = torch.arange(end.numel(), device=end.device)
    ancestors = (nodes.unsqueeze(0) < starts.unsqueeze(1)) & (end.unsqueeze(0) > starts.unsqueeze(1))
    if key_ok is not None:
        ancestors &= key_ok.unsqueeze(0)
    return ancestors
