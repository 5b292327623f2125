"""Tree attention: every packed token attends exactly to its ancestors and itself.

A tree in pre-order is described by ``end`` alone: key j is an ancestor-or-self of query i iff j <= i < end[j]
(the subtree of j is the index range [j, end[j])). ``key_ok`` optionally excludes keys (the MTP layer's root
slots): such a key is seen by itself only. Three exact implementations share that predicate:

- ``flex``: ``torch.nn.attention.flex_attention`` with a BlockMask built from the tree's block structure (blocks
  that no query of a block can see are skipped, blocks wholly inside every query's ancestry run unmasked). Compiled;
  used on CUDA. (In torch 2.13 flex attention has no backward on CPU.)
- ``blocks``: the CPU path. The ancestors of the queries of a block [s, e) are the strict ancestors of s plus nodes
  inside [s, e) (an ancestor a < s of a query q >= s has s in its subtree), so each query block attends to those
  keys only, gathered once per block and shared by every layer. Cost: that of causal attention along the paths.
- ``dense``: one [T, T] mask (small trees, and the reference in tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.model.attention import AttentionBackend

FLEX_BLOCK = 128
IMPLS = ("auto", "flex", "blocks", "dense")


def allowed(query: Tensor, key: Tensor, end: Tensor, key_ok: Tensor | None) -> Tensor:
    """Bool mask [len(query), len(key)] of the tree predicate for node indices ``query`` and ``key``."""
    q, k = query.unsqueeze(-1), key.unsqueeze(0)
    mask = (k <= q) & (q < end[key].unsqueeze(0))
    if key_ok is not None:
        mask &= key_ok[key].unsqueeze(0) | (k == q)
    return mask


@dataclass
class _Blocks:
    """Query blocks of ``size`` tokens; block b attends to ``keys[offsets[b]:offsets[b + 1]]`` under ``masks[b]``."""

    size: int
    keys: Tensor                # every block's key indices, concatenated (one gather per layer)
    key_counts: list[int]
    masks: list[Tensor]         # [block length, key count] each


def _plan_blocks(end: Tensor, key_ok: Tensor | None, size: int) -> _Blocks:
    length = end.numel()
    nodes = torch.arange(length, device=end.device)
    starts = torch.arange(0, length, size, device=end.device)
    # Strict ancestors of each block's first query: a < s < end[a].
    ancestors = (nodes.unsqueeze(0) < starts.unsqueeze(1)) & (end.unsqueeze(0) > starts.unsqueeze(1))
    if key_ok is not None:
        ancestors &= key_ok.unsqueeze(0)
    keys, masks = [], []
    for row, start in enumerate(starts.tolist()):
        local = nodes[start:start + size]
        block_keys = torch.cat([ancestors[row].nonzero().squeeze(-1), local])
        keys.append(block_keys)
        masks.append(allowed(local, block_keys, end, key_ok))
    return _Blocks(size, torch.cat(keys), [k.numel() for k in keys], masks)


def _block_structure(end: Tensor, key_ok: Tensor | None, padded: int) -> tuple[Tensor, Tensor]:
    """Per (query block, key block) of FLEX_BLOCK tokens: may any query see any key, and do all see all."""
    size = FLEX_BLOCK
    count = padded // size
    starts = torch.arange(count, device=end.device) * size
    stops = starts + size
    ends = end.view(count, size)
    max_end, min_end = ends.max(-1).values, ends.min(-1).values
    q_start, q_stop = starts.unsqueeze(1), stops.unsqueeze(1)
    k_start, k_stop = starts.unsqueeze(0), stops.unsqueeze(0)
    # The keys of a block see the query range [k_start, max_end): every node of [k_start, k_stop) is in it.
    any_ = (k_start < q_stop) & (max_end.unsqueeze(0) > q_start)
    full = (k_stop - 1 <= q_start) & (min_end.unsqueeze(0) >= q_stop)
    if key_ok is not None:
        full &= key_ok.view(count, size).all(-1).unsqueeze(0)
    return any_ & ~full, full


def _to_indices(blocks: Tensor) -> tuple[Tensor, Tensor]:
    counts = blocks.sum(-1).to(torch.int32)
    indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


_compiled_flex = None


def _flex():
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError:
        return False
    return True


class TreeAttention(AttentionBackend):
    """Ancestor-or-self attention over one packed tree (batch of one row). ``end`` [T] gives each node's subtree
    end in pre-order; ``key_ok`` [T] (optional) marks nodes other tokens may attend to. ``impl``: "auto" (flex on
    CUDA, blocks elsewhere, dense for trees up to ``dense_below`` tokens), "flex", "blocks" or "dense"."""

    def __init__(self, end: Tensor, key_ok: Tensor | None = None, impl: str = "auto", block_size: int = 256,
                 dense_below: int = 512, compile_flex: bool = True) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        if impl == "auto":
            if end.numel() <= dense_below:
                impl = "dense"
            else:
                impl = "flex" if flex_available(end.device) else "blocks"
        self.impl = impl
        self.end = end.long()
        self.key_ok = None if key_ok is None else key_ok.bool()
        self.block_size = block_size
        self.compile_flex = compile_flex
        self._plan = None

    @property
    def length(self) -> int:
        return self.end.numel()

    def dense_mask(self) -> Tensor:
        nodes = torch.arange(self.length, device=self.end.device)
        return allowed(nodes, nodes, self.end, self.key_ok)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        if q.shape[0] != 1 or q.shape[2] != self.length:
            raise ValueError(f"tree attention takes one row of {self.length} tokens, got q {tuple(q.shape)}")
        gqa = q.shape[1] != k.shape[1]
        if self.impl == "dense":
            if self._plan is None:
                self._plan = self.dense_mask()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._plan, scale=scale, enable_gqa=gqa)
        if self.impl == "flex":
            return self._attend_flex(q, k, v, scale, gqa)
        if self._plan is None:
            self._plan = _plan_blocks(self.end, self.key_ok, self.block_size)
        plan = self._plan
        # One gather and one split per layer: their backward is a single index_add and a single cat.
        keys = k.index_select(2, plan.keys).split(plan.key_counts, dim=2)
        values = v.index_select(2, plan.keys).split(plan.key_counts, dim=2)
        queries = q.split(plan.size, dim=2)
        outputs = [F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=gqa)
                   for qb, kb, vb, mask in zip(queries, keys, values, plan.masks, strict=True)]
        return torch.cat(outputs, dim=2)

    def block_mask(self):
        """The flex BlockMask of this tree (padded to a multiple of FLEX_BLOCK tokens)."""
        from torch.nn.attention.flex_attention import BlockMask

        length = self.length
        padded = math.ceil(length / FLEX_BLOCK) * FLEX_BLOCK
        extra = torch.arange(length, padded, device=self.end.device)
        end = torch.cat([self.end, extra + 1])              # padding tokens are roots seen by themselves only
        key_ok = None
        if self.key_ok is not None or padded > length:
            base = self.key_ok if self.key_ok is not None else torch.ones_like(self.end, dtype=torch.bool)
            key_ok = torch.cat([base, torch.zeros(padded - length, dtype=torch.bool, device=end.device)])
        partial, full = _block_structure(end, key_ok, padded)

        def mask_mod(b, h, q_idx, kv_idx):
            seen = (kv_idx <= q_idx) & (q_idx < end[kv_idx])
            if key_ok is not None:
                seen = seen & (key_ok[kv_idx] | (kv_idx == q_idx))
            return seen

        counts, indices = _to_indices(partial)
        full_counts, full_indices = _to_indices(full)
        return BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices, BLOCK_SIZE=FLEX_BLOCK,
                                        mask_mod=mask_mod, seq_lengths=(padded, padded))

    def _attend_flex(self, q: Tensor, k: Tensor, v: Tensor, scale: float, gqa: bool) -> Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        if self._plan is None:
            self._plan = self.block_mask()
        length = self.length
        padded = self._plan.seq_lengths[0]
        if padded > length:
            pad = (0, 0, 0, padded - length)
            q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        attend = _flex() if self.compile_flex else flex_attention
        out = attend(q, k, v, block_mask=self._plan, scale=scale, enable_gqa=gqa)
        return out[:, :, :length]
