"""Context parallelism for the learner: the tokens of one packed tree split across the ranks of a context group.

A job of W processes with ``--context-parallel N`` has W / N data-parallel groups of N consecutive ranks. The ranks
of a group get the same samples (the data-parallel split is over groups) and the same packed trees; each computes
its share of a tree's tokens (``shard_rows``) through every layer. Attention needs the keys and values of every
ancestor of a rank's tokens, wherever they were computed: each layer all-gathers its keys and values over the group
(``gather_rows``), and each rank attends with its own queries to the whole tree under the tree's mask (the
borrowed-slot machinery of ``TreeAttention``). The backward of that gather sums every rank's gradient for a key and
hands it to the rank that computed it, so the ancestors are exchanged, never recomputed.

Why all-gather rather than a ring or an all-to-all over heads: a tree's mask is arbitrary (a token sees its root
path only), so a ring would send every block to every rank anyway and need a schedule per tree, and splitting heads
(Ulysses) needs the key-value heads to divide by N (the built-in model has 2). With grouped-query attention the keys
and values are a fraction of a layer's activations, and gathering them per layer is what Llama 3's training did for
its document masks, for the same reason.

Shares are zig-zag: the tree's tokens (in pre-order) cut into 2N runs of equal size, rank r taking runs r and
2N − 1 − r, so that on a long causal chain (the expensive case) every rank gets as many early, cheap queries as
late, expensive ones: the attention work balances with the token count.

FSDP2 shards the parameters over all W ranks, as without context parallelism: a rank's gradients are its tokens'
share, and FSDP's reduction sums them over the group along with the data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from forge.learner.parallel import Distributed


@dataclass
class ContextGroup:
    """This rank's context-parallel group: ``size`` consecutive ranks, this one ``index`` among them."""

    size: int = 1
    index: int = 0
    group: object | None = None         # the process group (None with one rank)

    @property
    def enabled(self) -> bool:
        return self.size > 1


def context_groups(distributed: Distributed, size: int) -> tuple[ContextGroup, int, int]:
    """The context group of this rank, and its data-parallel index and count (every rank must call this: each
    group is created on all ranks)."""
    world = distributed.world_size
    if size < 1 or world % size:
        raise ValueError(f"--context-parallel {size} must divide the job's {world} processes")
    if size == 1:
        return ContextGroup(), distributed.rank, world
    mine = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= distributed.rank < first + size:
            mine = group
    return ContextGroup(size, distributed.rank % size, mine), distributed.rank // size, world // size


def shard_rows(count: int, size: int) -> list[Tensor]:
    """Per rank of a group of ``size``, the rows of ``count`` it computes, increasing: zig-zag runs of 2·size."""
    bounds = [count * i // (2 * size) for i in range(2 * size + 1)]
    shares = []
    for rank in range(size):
        late = 2 * size - 1 - rank
        shares.append(torch.cat([torch.arange(bounds[rank], bounds[rank + 1]),
                                 torch.arange(bounds[late], bounds[late + 1])]))
    return shares


class _GatherRows(torch.autograd.Function):
    """All-gather of every rank's rows along ``dim`` (rank order); backward: the sum of every rank's gradient for
    this rank's rows (``summed``), or this rank's own gradient for them (every rank computed the same loss from
    the gathered rows)."""

    @staticmethod
    def forward(ctx, own: Tensor, dim: int, counts: tuple[int, ...], index: int, group: object,
                summed: bool) -> Tensor:
        ctx.dim, ctx.counts, ctx.index, ctx.group, ctx.summed = dim, counts, index, group, summed
        widest = max(counts)
        shape = list(own.shape)
        shape[dim] = widest - own.shape[dim]
        padded = torch.cat([own, own.new_zeros(shape)], dim=dim).contiguous()
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part.narrow(dim, 0, n) for part, n in zip(parts, counts, strict=True)], dim=dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous()
        if ctx.summed:
            dist.all_reduce(grad, group=ctx.group)
        start = sum(ctx.counts[:ctx.index])
        return grad.narrow(ctx.dim, start, ctx.counts[ctx.index]), None, None, None, None, None


def gather_rows(own: Tensor, dim: int, counts: tuple[int, ...], group: ContextGroup, summed: bool = True) -> Tensor:
    """Every rank's ``own`` rows along ``dim``, in rank order (``counts``: how many each has). ``summed``: the
    ranks use the result differently (keys, hidden states), so a row's gradient is the sum of theirs; otherwise
    they all compute the same function of it (the loss) and each keeps its own."""
    return _GatherRows.apply(own, dim, counts, group.index, group.group, summed)


@dataclass
class Share:
    """This rank's share of ``count`` rows: ``rows`` (increasing), every rank's row count in rank order, and
    ``to_computed``, the position in the gathered rows (rank order) of each row."""

    rows: Tensor
    counts: tuple[int, ...]
    to_computed: Tensor

    def gather(self, own: Tensor, dim: int, group: ContextGroup, summed: bool = True) -> Tensor:
        """Every rank's rows of ``own`` along ``dim``, back in row order."""
        return gather_rows(own, dim, self.counts, group, summed).index_select(dim, self.to_computed)


def share_of(count: int, group: ContextGroup, device: torch.device | str) -> Share:
    shares = shard_rows(count, group.size)
    return Share(shares[group.index].to(device), tuple(int(s.numel()) for s in shares),
                 torch.argsort(torch.cat(shares)).to(device))


class KeyCompletion(Protocol):
    """What gives a tree's queries the keys and values of the slots they did not compute (``TreeAttention``)."""

    def complete(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Every slot's keys and values [1, Hkv, L, D] (slot order), from those computed here."""


@dataclass
class ShardKeys:
    """Where a rank's queries find the keys and values of every slot of a tree it computes a share of: each rank's
    computed rows gathered over the group, then (``then``, when the tree borrows slots from the step's stem) the
    borrowed ones. A piece of the stem keeps the gathered rows (``recorded``) for the trees to borrow."""

    group: ContextGroup
    share: Share
    then: KeyCompletion | None = None
    recorded: dict[int, tuple[Tensor, Tensor]] | None = None   # when given, each layer's gathered keys and values

    def complete(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.share.gather(k, 2, self.group), self.share.gather(v, 2, self.group)
        if self.recorded is not None:
            self.recorded[layer] = (k, v)
        return (k, v) if self.then is None else self.then.complete(layer, k, v)
