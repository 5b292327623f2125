"""Tree attention with ``torch.nn.attention.flex_attention`` (compiled; the GPU path). The BlockMask is built from
the tree's block structure rather than by evaluating the predicate on every pair: for blocks of 128 queries and
128 keys, the keys of a block are seen by the query range [key block start, max end of its keys), so a pair of
blocks is skipped when the ranges miss, and runs unmasked when every key is an ancestor of every query (all keys
before the first query and every key's subtree reaching past the last). In torch 2.13 flex attention has no
backward on CPU; the compiled kernel runs forward on CPU too, which is how the tests check the block structure.

With ``queries`` (the other slots borrowed from the step's stem), the kernel runs over every slot, the borrowed
slots' queries zero and seen by themselves only (one diagonal block of work each), and returns the query rows.

A sliding window (keys less than ``window`` depths above the query) joins the mask, every visible block then
evaluated under it; a soft cap on the scores is a score modifier."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

FLEX_BLOCK = 128

_compiled = None


def flex_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError:
        return False
    return True


def _structure(end: Tensor, key_ok: Tensor, query_ok: Tensor, padded: int) -> tuple[Tensor, Tensor]:
    """Per (query block, key block): partially visible (mask needed), and wholly visible."""
    count = padded // FLEX_BLOCK
    starts = torch.arange(count, device=end.device) * FLEX_BLOCK
    stops = starts + FLEX_BLOCK
    ends = end.view(count, FLEX_BLOCK)
    max_end, min_end = ends.max(-1).values, ends.min(-1).values
    q_start, q_stop = starts.unsqueeze(1), stops.unsqueeze(1)
    k_start, k_stop = starts.unsqueeze(0), stops.unsqueeze(0)
    asking = query_ok.view(count, FLEX_BLOCK)
    diagonal = torch.eye(count, dtype=torch.bool, device=end.device)
    any_ = (k_start < q_stop) & (max_end.unsqueeze(0) > q_start) & (asking.any(-1).unsqueeze(1) | diagonal)
    full = (k_stop - 1 <= q_start) & (min_end.unsqueeze(0) >= q_stop)
    full &= key_ok.view(count, FLEX_BLOCK).all(-1).unsqueeze(0) & asking.all(-1).unsqueeze(1)
    return any_ & ~full, full


def _indices(blocks: Tensor) -> tuple[Tensor, Tensor]:
    counts = blocks.sum(-1).to(torch.int32)
    indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


def padded_length(length: int) -> int:
    """FLEX_BLOCK times a power of two: the kernel is compiled for static shapes (``dynamic=False``), so packed
    trees of any length share a handful of compiled shapes (below dynamo's recompile limit)."""
    blocks = -(-length // FLEX_BLOCK)
    return FLEX_BLOCK << max(0, blocks - 1).bit_length()


def block_mask(end: Tensor, key_ok: Tensor | None, queries: Tensor | None = None, depth: Tensor | None = None,
               window: int | None = None):
    """The BlockMask of a tree, padded to ``padded_length`` tokens (padding: roots seen by themselves). ``key_ok``
    and the query slots are always tensors, so the main and MTP attention share one compiled kernel per padded
    length. With ``window``, keys at least ``window`` depths above the query (``depth`` per slot) are hidden."""
    from torch.nn.attention.flex_attention import BlockMask

    length = end.numel()
    padded = padded_length(length)
    extra = torch.arange(length, padded, device=end.device)
    end = torch.cat([end, extra + 1])
    base = key_ok if key_ok is not None else torch.ones(length, dtype=torch.bool, device=end.device)
    key_ok = torch.cat([base, torch.zeros(padded - length, dtype=torch.bool, device=end.device)])
    query_ok = torch.zeros(padded, dtype=torch.bool, device=end.device)
    query_ok[:length] = True
    if queries is not None:
        query_ok[:length] = False
        query_ok[queries] = True
    partial, full = _structure(end, key_ok, query_ok, padded)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < end[kv_idx]) & ((key_ok[kv_idx] & query_ok[q_idx]) | (kv_idx == q_idx))

    if window is not None:
        if depth is None:
            raise ValueError("a windowed tree mask needs the slots' depths")
        depths = torch.cat([depth.long(), torch.zeros(padded - length, dtype=torch.long, device=end.device)])
        tree_mod = mask_mod

        def mask_mod(b, h, q_idx, kv_idx):
            return tree_mod(b, h, q_idx, kv_idx) & (depths[q_idx] - depths[kv_idx] < window)

        partial, full = partial | full, torch.zeros_like(full)

    counts, indices = _indices(partial)
    full_counts, full_indices = _indices(full)
    return BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices, BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(padded, padded))


def _softcapped(cap: float):
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return score_mod


def attend_flex(mask, q: Tensor, k: Tensor, v: Tensor, scale: float, compile: bool = True,
                queries: Tensor | None = None, softcap: float | None = None) -> Tensor:
    global _compiled
    from torch.nn.attention.flex_attention import flex_attention

    if queries is not None:
        full = q.new_zeros(q.shape[0], q.shape[1], k.shape[2], q.shape[3])
        return attend_flex(mask, full.index_copy(2, queries, q), k, v, scale, compile, softcap=softcap)[:, :, queries]
    length = q.shape[2]
    padded = mask.seq_lengths[0]
    if padded > length:
        pad = (0, 0, 0, padded - length)
        q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
    if compile and _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    attend = _compiled if compile else flex_attention
    out = attend(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                 score_mod=None if softcap is None else _softcapped(softcap))
    return out[:, :, :length]
