"""Tree attention with public ``scaled_dot_product_attention`` only (the fallback on any device): each block of
queries [s, e) attends to the strict ancestors of s plus the nodes of [s, e) (an ancestor a < s of a query q >= s
has s in its subtree), gathered once per layer, under an additive mask shared by every layer. Memory grows with
(number of blocks × depth): prefer ``segments`` on CPU and ``flex`` on GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.learner.tree.mask import additive, allowed, strict_ancestors


@dataclass
class GatherPlan:
    size: int
    keys: Tensor                # every block's key indices, concatenated (one gather per layer)
    key_counts: list[int]
    masks: list[Tensor]         # additive [block length, key count] each


def plan_gather(end: Tensor, key_ok: Tensor | None, size: int, dtype: torch.dtype) -> GatherPlan:
    length = end.numel()
    nodes = torch.arange(length, device=end.device)
    starts = torch.arange(0, length, size, device=end.device)
    ancestors = strict_ancestors(end, key_ok, starts)
    keys, masks = [], []
    for row, start in enumerate(starts.tolist()):
        local = nodes[start:start + size]
        block_keys = torch.cat([ancestors[row].nonzero().squeeze(-1), local])
        keys.append(block_keys)
        masks.append(additive(allowed(local, block_keys, end, key_ok), dtype))
    return GatherPlan(size, torch.cat(keys), [k.numel() for k in keys], masks)


def attend_gather(plan: GatherPlan, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    gqa = q.shape[1] != k.shape[1]
    # One gather and one split per layer: their backward is a single index_add and a single cat.
    keys = k.index_select(2, plan.keys).split(plan.key_counts, dim=2)
    values = v.index_select(2, plan.keys).split(plan.key_counts, dim=2)
    outputs = [F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=gqa)
               for qb, kb, vb, mask in zip(q.split(plan.size, dim=2), keys, values, plan.masks, strict=True)]
    return torch.cat(outputs, dim=2)
