"""``TreeAttention``: the attention backend of a packed tree, every token attending exactly to its ancestors and
itself (``forge.learner.tree.mask``). It picks one of four exact implementations:

- ``flex``: flex attention with a BlockMask from the tree's block structure, compiled (CUDA; see ``flex``);
- ``segments``: the fused CPU flash kernel over shared-prefix runs and local blocks, merged by log-sum-exp (CPU; see
  ``segments``);
- ``gather``: public scaled-dot-product attention over gathered keys under per-block masks (any device);
- ``dense``: one [T, T] mask (small trees, and the reference in tests).

"auto" takes flex on CUDA, segments on CPU (gather where either is missing), dense below ``dense_below`` tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.learner.tree import flex, gather, segments
from forge.learner.tree.mask import allowed
from forge.model.attention import AttentionBackend

IMPLS = ("auto", "flex", "segments", "gather", "dense")


def choose(device: torch.device, length: int, dense_below: int = 512) -> str:
    if length <= dense_below:
        return "dense"
    if device.type == "cuda":
        return "flex" if flex.flex_available(device) else "gather"
    return "segments" if device.type == "cpu" and segments.available() else "gather"


class TreeAttention(AttentionBackend):
    """Ancestor-or-self attention over one packed tree (a batch of one row). ``end`` [T] gives each node's subtree
    end in pre-order; ``key_ok`` [T] (optional) marks the nodes other tokens may attend to. The plan (masks, runs)
    is built on the first layer and shared by the others."""

    def __init__(self, end: Tensor, key_ok: Tensor | None = None, impl: str = "auto", block_size: int = 256,
                 dense_below: int = 512, compile_flex: bool = True) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.impl = choose(end.device, end.numel(), dense_below) if impl == "auto" else impl
        self.end = end.long()
        self.key_ok = None if key_ok is None else key_ok.bool()
        self.block_size = block_size
        self.compile_flex = compile_flex
        self.plan = None

    @property
    def length(self) -> int:
        return self.end.numel()

    def dense_mask(self) -> Tensor:
        nodes = torch.arange(self.length, device=self.end.device)
        return allowed(nodes, nodes, self.end, self.key_ok)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        if q.shape[0] != 1 or q.shape[2] != self.length:
            raise ValueError(f"tree attention takes one row of {self.length} tokens, got q {tuple(q.shape)}")
        if self.impl == "dense":
            if self.plan is None:
                self.plan = self.dense_mask()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.plan, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])
        if self.impl == "flex":
            if self.plan is None:
                self.plan = flex.block_mask(self.end, self.key_ok)
            return flex.attend_flex(self.plan, q, k, v, scale, self.compile_flex)
        if self.impl == "segments":
            if self.plan is None:
                self.plan = segments.plan_segments(self.end, self.key_ok, self.block_size, q.dtype)
            return segments.attend_segments(self.plan, q, k, v, scale)
        if self.plan is None:
            self.plan = gather.plan_gather(self.end, self.key_ok, self.block_size, q.dtype)
        return gather.attend_gather(self.plan, q, k, v, scale)
