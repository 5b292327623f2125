"""``TreeAttention``: the attention backend of a packed tree, every token attending exactly to its ancestors and
itself (``forge.learner.tree.mask``). It picks one of four exact implementations:

- ``flex``: flex attention with a BlockMask from the tree's block structure, compiled (CUDA; see ``flex``);
- ``segments``: the fused CPU flash kernel over shared-prefix runs and local blocks, merged by log-sum-exp (CPU; see
  ``segments``);
- ``gather``: public scaled-dot-product attention over gathered keys under per-block masks (any device);
- ``dense``: one [T, T] mask (small trees, and the reference in tests).

"auto" takes flex on CUDA, segments on CPU (gather where either is missing), dense below ``dense_below`` tokens.

A tree that borrows slots from the step's stem computes queries for its own slots only (``queries``) and takes the
borrowed slots' keys and values from the stem's (``BorrowedKeys``); a stem's pass keeps each layer's keys and values
(``record``) for the trees to borrow. A rank computing its share of a tree under context parallelism takes the others'
the same way (``forge.learner.context_parallel.ShardKeys``).

Windowed and soft-capped layers (``attend_windowed``: Mistral, Gemma, Phi-3 through transformers) take the slots'
depths: a key is seen when it is an ancestor-or-self less than the window's positions above the query. They run
flex on CUDA (the window in the mask, the cap as a score modifier) and dense attention elsewhere (one [T, T] mask per
window, built once per tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.learner.context_parallel import KeyCompletion
from forge.learner.tree import flex, gather, segments
from forge.learner.tree.mask import allowed
from forge.model.attention import AttentionBackend, masked_attention, window_mask

IMPLS = ("auto", "flex", "segments", "gather", "dense")


def choose(device: torch.device, length: int, dense_below: int = 512) -> str:
    if length <= dense_below:
        return "dense"
    if device.type == "cuda":
        return "flex" if flex.flex_available(device) else "gather"
    return "segments" if device.type == "cpu" and segments.available() else "gather"


@dataclass
class BorrowedKeys:
    """Where a tree's borrowed slots find their keys and values: rows ``stem_rows`` of the stem's recorded
    ``keys`` (per layer, [1, Hkv, C, D] each); ``order`` puts cat(computed, borrowed) back in slot order."""

    keys: dict[int, tuple[Tensor, Tensor]]
    stem_rows: Tensor
    order: Tensor

    def complete(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if layer not in self.keys:
            raise ValueError(f"the stem recorded no keys for layer {layer}")
        stem_k, stem_v = self.keys[layer]
        k = torch.cat([k, stem_k.index_select(2, self.stem_rows)], dim=2).index_select(2, self.order)
        v = torch.cat([v, stem_v.index_select(2, self.stem_rows)], dim=2).index_select(2, self.order)
        return k, v


class TreeAttention(AttentionBackend):
    """Ancestor-or-self attention over one packed tree (a batch of one row). ``end`` [L] gives each slot's subtree
    end in pre-order; ``key_ok`` [L] (optional) marks the slots other tokens may attend to; ``queries`` (optional,
    increasing) are the slots the queries belong to, when not all (the rest are borrowed through ``borrow``).
    ``record`` keeps each layer's keys and values in ``recorded``. ``depth`` [L] (each slot's position) is what
    windowed layers measure their window in. The plan (masks, runs) is built on the first layer and shared by the
    others."""

    def __init__(self, end: Tensor, key_ok: Tensor | None = None, impl: str = "auto", block_size: int = 256,
                 dense_below: int = 512, compile_flex: bool = True, queries: Tensor | None = None,
                 borrow: KeyCompletion | None = None, record: bool = False, depth: Tensor | None = None) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        if (queries is None) != (borrow is None):
            raise ValueError("a tree with borrowed slots needs both its query slots and the borrowed keys")
        self.impl = choose(end.device, end.numel(), dense_below) if impl == "auto" else impl
        self.end = end.long()
        self.key_ok = None if key_ok is None else key_ok.bool()
        self.queries = None if queries is None else queries.long()
        self.borrow = borrow
        self.block_size = block_size
        self.compile_flex = compile_flex
        self.recorded: dict[int, tuple[Tensor, Tensor]] | None = {} if record else None
        self.depth = None if depth is None else depth.long()
        self.plan = None
        self.windowed_plans: dict[int | None, object] = {}      # per window, for windowed or soft-capped layers

    @property
    def length(self) -> int:
        return self.end.numel()

    @property
    def num_queries(self) -> int:
        return self.length if self.queries is None else self.queries.numel()

    def dense_mask(self) -> Tensor:
        """[queries, L] bool: the keys each query sees."""
        nodes = torch.arange(self.length, device=self.end.device)
        return allowed(nodes if self.queries is None else self.queries, nodes, self.end, self.key_ok)

    def _all_keys(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Every slot's keys and values (recorded for a stem, borrowed ones completed)."""
        if q.shape[0] != 1 or q.shape[2] != self.num_queries:
            raise ValueError(f"tree attention takes one row of {self.num_queries} queries, got q {tuple(q.shape)}")
        if self.recorded is not None:
            self.recorded[layer] = (k, v)
        if self.borrow is not None:
            k, v = self.borrow.complete(layer, k, v)
        return k, v

    def attend_windowed(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None = None,
                        softcap: float | None = None) -> Tensor:
        if window is None and softcap is None:
            return self.attend(layer, q, k, v, scale)
        if window is not None and self.depth is None:
            raise ValueError("a tree's windowed layer needs its slots' depths: build TreeAttention with depth=")
        k, v = self._all_keys(layer, q, k, v)
        if self.num_queries == 0:
            return _no_queries(q, k, v)
        plan = self.windowed_plans.get(window)
        if plan is None:
            plan = self.windowed_plans[window] = self._windowed_plan(window)
        if self.impl == "flex":
            return flex.attend_flex(plan, q, k, v, scale, self.compile_flex, self.queries, softcap)
        return masked_attention(q, k, v, scale, plan, softcap)

    def _windowed_plan(self, window: int | None):
        """flex's BlockMask with the window, or elsewhere the dense [queries, L] mask."""
        if self.impl == "flex":
            return flex.block_mask(self.end, self.key_ok, self.queries, self.depth, window)
        mask = self.dense_mask()
        if window is not None:
            query_depth = self.depth if self.queries is None else self.depth[self.queries]
            mask &= window_mask(query_depth, self.depth, window)
        return mask

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        k, v = self._all_keys(layer, q, k, v)
        if self.num_queries == 0:
            return _no_queries(q, k, v)
        if self.impl == "dense":
            if self.plan is None:
                self.plan = self.dense_mask()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.plan, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])
        if self.impl == "flex":
            if self.plan is None:
                self.plan = flex.block_mask(self.end, self.key_ok, self.queries)
            return flex.attend_flex(self.plan, q, k, v, scale, self.compile_flex, self.queries)
        if self.impl == "segments":
            if self.plan is None:
                self.plan = segments.plan_segments(self.end, self.key_ok, self.block_size, q.dtype,
                                                   queries=self.queries)
            return segments.attend_segments(self.plan, q, k, v, scale)
        if self.plan is None:
            self.plan = gather.plan_gather(self.end, self.key_ok, self.block_size, q.dtype, self.queries)
        return gather.attend_gather(self.plan, q, k, v, scale)


def _no_queries(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The (empty) output of a pass without queries, kept on the graph of the keys and values: under context
    parallelism they were gathered from the group, and the gather's backward is a collective every rank must run."""
    return q.new_zeros(q.shape) + 0.0 * (k.sum() + v.sum())
