"""Tree attention on CPU from the fused flash-attention kernel, without a [T, T] mask and without copying the keys
of long shared prefixes.

The queries are cut into blocks [s, e) (at most ``size`` tokens, cut early where a new branch starts). The keys a
block needs are the strict ancestors of s plus nodes of [s, e). Ancestors whose subtree reaches past e are seen by
every query of the block: they form a root path, i.e. a few contiguous index runs, each attended to unmasked as a
view of the keys (runs shorter than ``min_run`` are gathered instead). If the block is a chain (every node the child of the one before) its own nodes are attended to
causally; otherwise the remaining ancestors and the block's nodes are gathered under an explicit mask. The partial
results are merged through their log-sum-exp; backward runs the kernel's backward on each part with the merged
output and log-sum-exp, which gives each part's exact share of the gradient.

With ``queries`` (a tree whose other slots are borrowed from the step's stem) a block's queries are the query slots
in [s, e), which are consecutive rows of q; keys are slots, as without.

Needs ``aten::_scaled_dot_product_flash_attention_for_cpu`` (torch >= 2.3); ``available()`` says whether it is
there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from forge.learner.tree.mask import additive, allowed, strict_ancestors


def _ops():
    aten = torch.ops.aten
    return aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward


def available() -> bool:
    try:
        _ops()
    except (AttributeError, RuntimeError):
        return False
    return True


@dataclass
class Part:
    start: int                  # contiguous keys [start, stop) when ``keys`` is None
    stop: int
    causal: bool = False
    keys: Tensor | None = None  # gathered key indices
    mask: Tensor | None = None  # additive [block length, len(keys)]


@dataclass
class Block:
    start: int                  # slots [start, stop)
    stop: int
    parts: list[Part]
    row_start: int              # their queries: rows [row_start, row_stop) of q
    row_stop: int


def _runs(indices: Tensor) -> list[tuple[int, int]]:
    """Contiguous runs [a, b) of sorted ``indices``."""
    if indices.numel() == 0:
        return []
    breaks = ((indices[1:] - indices[:-1]) != 1).nonzero().squeeze(-1)
    firsts = torch.cat([indices[:1], indices[breaks + 1]]).tolist()
    lasts = torch.cat([indices[breaks], indices[-1:]]).tolist()
    return [(a, b + 1) for a, b in zip(firsts, lasts, strict=True)]


def _boundaries(end: Tensor, size: int) -> list[int]:
    """Block starts: every ``size`` tokens, and where a branch starts once the block has ``size // 4`` tokens."""
    length = end.numel()
    nodes = torch.arange(1, length, device=end.device)
    branch = (end[:-1] <= nodes).nonzero().squeeze(-1).add(1).tolist()     # node i whose parent is not i - 1
    starts, current = [0], 0
    for node in [*branch, length]:
        while node - current > size:
            current += size
            starts.append(current)
        if node < length and node - current >= max(1, size // 4):
            current = node
            starts.append(current)
    return starts


def plan_segments(end: Tensor, key_ok: Tensor | None, size: int, dtype: torch.dtype,
                  min_run: int = 64, queries: Tensor | None = None) -> list[Block]:
    length = end.numel()
    nodes = torch.arange(length, device=end.device)
    starts = _boundaries(end, size)
    stops = [*starts[1:], length]
    row_bounds = [*starts, length]
    if queries is not None:
        row_bounds = torch.searchsorted(queries, torch.tensor(row_bounds, device=end.device)).tolist()
    ancestors = strict_ancestors(end, key_ok, torch.tensor(starts, device=end.device))
    blocks = []
    for row, (start, stop) in enumerate(zip(starts, stops, strict=True)):
        row_start, row_stop = row_bounds[row], row_bounds[row + 1]
        if row_start == row_stop:
            continue                    # every slot of the block is borrowed: nothing to compute
        shared = ancestors[row] & (end >= stop)
        runs = [(a, b) for a, b in _runs(shared.nonzero().squeeze(-1)) if b - a >= min_run]
        parts = [Part(a, b) for a, b in runs]
        rest = ancestors[row].clone()
        for a, b in runs:
            rest[a:b] = False           # short runs are gathered with the rest: one kernel call, not many
        rest = rest.nonzero().squeeze(-1)
        local = nodes[start:stop]
        asked = local if queries is None else queries[row_start:row_stop]
        chain = bool((end[start:stop - 1] > local[1:]).all()) and row_stop - row_start == stop - start
        if key_ok is not None:
            chain &= bool(key_ok[start:stop].all()) or stop - start == 1
        if chain and rest.numel() == 0:
            parts.append(Part(start, stop, causal=True))
        else:
            keys = torch.cat([rest, local])
            parts.append(Part(0, 0, keys=keys, mask=additive(allowed(asked, keys, end, key_ok), dtype)))
        blocks.append(Block(start, stop, parts, row_start, row_stop))
    return blocks


def _keys(part: Part, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    if part.keys is None:
        return k[:, :, part.start:part.stop], v[:, :, part.start:part.stop]
    return k.index_select(2, part.keys), v.index_select(2, part.keys)


class _SegmentAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, blocks: list[Block], scale: float) -> Tensor:
        forward, _ = _ops()
        out = q.new_empty(q.shape)
        lse = q.new_empty(q.shape[:3], dtype=torch.float32)
        for block in blocks:
            rows = slice(block.row_start, block.row_stop)
            qb = q[:, :, rows]
            acc = total = None
            for part in block.parts:
                kb, vb = _keys(part, k, v)
                o, m = forward(qb, kb, vb, 0.0, part.causal, attn_mask=part.mask, scale=scale)
                o = o.float()
                if acc is None:
                    acc, total = o, m
                    continue
                merged = torch.logaddexp(total, m)
                acc = acc * (total - merged).exp().unsqueeze(-1) + o * (m - merged).exp().unsqueeze(-1)
                total = merged
            out[:, :, rows] = acc
            lse[:, :, rows] = total
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.blocks, ctx.scale = blocks, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        _, backward = _ops()
        q, k, v, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for block in ctx.blocks:
            span = slice(block.row_start, block.row_stop)
            qb, gb, ob, lb = q[:, :, span], grad[:, :, span], out[:, :, span], lse[:, :, span]
            for part in block.parts:
                kb, vb = _keys(part, k, v)
                gq, gk, gv = backward(gb, qb, kb, vb, ob, lb, 0.0, part.causal, attn_mask=part.mask,
                                      scale=ctx.scale)
                dq[:, :, span] += gq
                if part.keys is None:
                    dk[:, :, part.start:part.stop] += gk
                    dv[:, :, part.start:part.stop] += gv
                else:
                    dk.index_add_(2, part.keys, gk.float())
                    dv.index_add_(2, part.keys, gv.float())
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def attend_segments(blocks: list[Block], q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return _SegmentAttention.apply(q, k, v, blocks, scale)
