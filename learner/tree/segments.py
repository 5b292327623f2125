"""Tree attention on CPU from the fused flash-attention kernel, without a [T, T] mask and without copying the keys
of long shared prefixes.

The queries are cut into blocks [s, e): at branch starts and at forks (once the block has ``size // 4`` tokens),
within a chain every ``chain_size`` tokens, and every ``size`` tokens in a block that took in a branch. The keys a
block needs are the strict ancestors of s plus nodes of [s, e).

- *Shared runs.* Ancestors whose subtree reaches past e are seen by every query of the block. They form a root path:
  a few contiguous index runs, cut at forks. A run of at least ``min_run`` keys is attended to unmasked, as a view of
  the keys, and once for all the consecutive blocks below its fork: one kernel call over all their query rows. (The
  CPU kernel does more work per second the more query rows a call has; a long system prompt is attended to in one
  call for the whole tree.)
- *The block itself.* A chain (every node the child of the one before) attends to its own nodes causally and to the
  short runs, gathered, unmasked. Any other block gathers the short runs and its own nodes under an explicit mask.

The partial results are merged per query row through their log-sum-exp; backward runs the kernel's backward on each
part with the merged output and log-sum-exp, which gives each part's exact share of the gradient.

With ``queries`` (a tree whose other slots are borrowed from the step's stem) a block's queries are the query slots
in [s, e), which are consecutive rows of q; keys are slots, as without.

Needs ``aten::_scaled_dot_product_flash_attention_for_cpu`` (torch >= 2.3); ``available()`` says whether it is
there.
"""

from __future__ import annotations

import bisect
import itertools
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


CHAIN_SIZE = 1024    # the CPU kernel reaches its rate from ~768 queries a call; masked blocks stay at ``size``


@dataclass
class Part:
    """Queries rows [row_start, row_stop) of q against keys [start, stop) (or the gathered ``keys``), unmasked,
    causal or under an additive ``mask`` [rows, len(keys)]."""

    row_start: int
    row_stop: int
    start: int = 0
    stop: int = 0
    causal: bool = False
    keys: Tensor | None = None
    mask: Tensor | None = None


def _runs(indices: Tensor) -> list[tuple[int, int]]:
    """Contiguous runs [a, b) of sorted ``indices``."""
    if indices.numel() == 0:
        return []
    breaks = ((indices[1:] - indices[:-1]) != 1).nonzero().squeeze(-1)
    firsts = torch.cat([indices[:1], indices[breaks + 1]]).tolist()
    lasts = torch.cat([indices[breaks], indices[-1:]]).tolist()
    return [(a, b + 1) for a, b in zip(firsts, lasts, strict=True)]


def _split(run: tuple[int, int], forks: list[int]) -> list[tuple[int, int]]:
    """``run`` cut at the fork points inside it (sorted ``forks``)."""
    a, b = run
    inner = forks[bisect.bisect_right(forks, a):bisect.bisect_left(forks, b)]
    cuts = [a, *inner, b]
    return list(itertools.pairwise(cuts))


def _forks(end: Tensor) -> Tensor:
    """[T - 1] bool, entry i - 1 for node i: its parent i - 1 has another child."""
    return end[1:] < end[:-1]


def _boundaries(end: Tensor, size: int, chain_size: int, fork: Tensor) -> list[int]:
    """Block starts: where a branch starts or a fork ends a chain, once the block has ``size // 4`` tokens; within
    a chain every ``chain_size`` tokens, and every ``size`` tokens in a block that took in a branch."""
    length = end.numel()
    branch = end[:-1] <= torch.arange(1, length, device=end.device)     # node i whose parent is not i - 1
    cuts = (branch | fork).nonzero().squeeze(-1).add(1).tolist()
    starts, current, crossed = [0], 0, False
    for node in [*cuts, length]:
        while node - current > (size if crossed else chain_size):
            current += size if crossed else chain_size
            starts.append(current)
            crossed = False
        if node == length:
            break
        if node - current >= max(1, size // 4):
            current = node
            starts.append(current)
            crossed = False
        else:
            crossed |= bool(branch[node - 1])
    return starts


def plan_segments(end: Tensor, key_ok: Tensor | None, size: int, dtype: torch.dtype,
                  min_run: int = 64, queries: Tensor | None = None, chain_size: int = CHAIN_SIZE) -> list[Part]:
    length = end.numel()
    nodes = torch.arange(length, device=end.device)
    fork = _forks(end)
    starts = _boundaries(end, size, max(size, chain_size), fork)
    stops = [*starts[1:], length]
    row_bounds = [*starts, length]
    if queries is not None:
        row_bounds = torch.searchsorted(queries, torch.tensor(row_bounds, device=end.device)).tolist()
    forks = fork.nonzero().squeeze(-1).add(1).tolist()
    ancestors = strict_ancestors(end, key_ok, torch.tensor(starts, device=end.device))
    shared_parts: dict[tuple[int, int], list[Part]] = {}
    parts = []
    for row, (start, stop) in enumerate(zip(starts, stops, strict=True)):
        row_start, row_stop = row_bounds[row], row_bounds[row + 1]
        if row_start == row_stop:
            continue                    # every slot of the block is borrowed: nothing to compute
        shared = ancestors[row] & (end >= stop)
        pieces = [piece for run in _runs(shared.nonzero().squeeze(-1)) for piece in _split(run, forks)]
        rest = ancestors[row].clone()
        for a, b in pieces:
            if b - a < min_run:
                continue                # short pieces are gathered with the rest: one kernel call, not many
            rest[a:b] = False
            runs = shared_parts.setdefault((a, b), [])
            if runs and runs[-1].row_stop == row_start:
                runs[-1].row_stop = row_stop    # the blocks below a fork share its run: one call for them all
            else:
                runs.append(Part(row_start, row_stop, a, b))
        rest = rest.nonzero().squeeze(-1)
        local = nodes[start:stop]
        asked = local if queries is None else queries[row_start:row_stop]
        chain = bool((end[start:stop - 1] > local[1:]).all()) and row_stop - row_start == stop - start
        if key_ok is not None:
            chain &= bool(key_ok[start:stop].all()) or stop - start == 1
        if chain:
            if rest.numel():
                parts.append(Part(row_start, row_stop, keys=rest))   # a chain's ancestors are seen by all its queries
            parts.append(Part(row_start, row_stop, start, stop, causal=True))
        else:
            keys = torch.cat([rest, local])
            parts.append(Part(row_start, row_stop, keys=keys,
                              mask=additive(allowed(asked, keys, end, key_ok), dtype)))
    return [part for runs in shared_parts.values() for part in runs] + parts


def _keys(part: Part, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    if part.keys is None:
        return k[:, :, part.start:part.stop], v[:, :, part.start:part.stop]
    return k.index_select(2, part.keys), v.index_select(2, part.keys)


class _SegmentAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, parts: list[Part], scale: float) -> Tensor:
        forward, _ = _ops()
        acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        for part in parts:
            rows = slice(part.row_start, part.row_stop)
            kb, vb = _keys(part, k, v)
            o, m = forward(q[:, :, rows], kb, vb, 0.0, part.causal, attn_mask=part.mask, scale=scale)
            total = lse[:, :, rows]
            merged = torch.logaddexp(total, m)
            acc[:, :, rows] = acc[:, :, rows] * (total - merged).exp().unsqueeze(-1) \
                + o.float() * (m - merged).exp().unsqueeze(-1)
            lse[:, :, rows] = merged
        out = acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.parts, ctx.scale = parts, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        _, backward = _ops()
        q, k, v, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for part in ctx.parts:
            rows = slice(part.row_start, part.row_stop)
            kb, vb = _keys(part, k, v)
            gq, gk, gv = backward(grad[:, :, rows], q[:, :, rows], kb, vb, out[:, :, rows], lse[:, :, rows], 0.0,
                                  part.causal, attn_mask=part.mask, scale=ctx.scale)
            dq[:, :, rows] += gq
            if part.keys is None:
                dk[:, :, part.start:part.stop] += gk
                dv[:, :, part.start:part.stop] += gv
            else:
                dk.index_add_(2, part.keys, gk.float())
                dv.index_add_(2, part.keys, gv.float())
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def attend_segments(parts: list[Part], q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return _SegmentAttention.apply(q, k, v, parts, scale)
