"""Tree attention with public ``scaled_dot_product_attention`` only (the fallback on any device): each block of
queries [s, e) attends to the strict ancestors of s plus the nodes of [s, e) (an ancestor a < s of a query q >= s
has s in its subtree), gathered once per layer, under an additive mask shared by every layer. Memory grows with
(number of blocks × depth): prefer ``segments`` on CPU and ``flex`` on GPU. With ``queries`` (the other slots
borrowed from the step's stem), blocks are ``size`` consecutive queries [s, ..., e − 1] and see the strict ancestors
of s plus the slots [s, e)."""

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


def plan_gather(end: Tensor, key_ok: Tensor | None, size: int, dtype: torch.dtype,
                queries: Tensor | None = None) -> GatherPlan:
    nodes = torch.arange(end.numel(), device=end.device)
    queries = nodes if queries is None else queries
    firsts = queries[::size]
    ancestors = strict_ancestors(end, key_ok, firsts)
    keys, masks = [], []
    for row, block in enumerate(queries.split(size)):
        first, last = int(block[0]), int(block[-1])
        block_keys = torch.cat([ancestors[row].nonzero().squeeze(-1), nodes[first:last + 1]])
        keys.append(block_keys)
        masks.append(additive(allowed(block, block_keys, end, key_ok), dtype))
    return GatherPlan(size, torch.cat(keys), [k.numel() for k in keys], masks)


def attend_gather(plan: GatherPlan, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    gqa = q.shape[1] != k.shape[1]
    # One gather and one split per layer: their backward is a single index_add and a single cat.
    keys = k.index_select(2, plan.keys).split(plan.key_counts, dim=2)
    values = v.index_select(2, plan.keys).split(plan.key_counts, dim=2)
    outputs = [F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=gqa)
               for qb, kb, vb, mask in zip(q.split(plan.size, dim=2), keys, values, plan.masks, strict=True)]
    return torch.cat(outputs, dim=2)
