"""The torch engine's linear projections on CPU through oneDNN, on weights packed once at load (fp32).

``torch.nn.functional.linear`` on CPU runs MKL's sgemm on the row-major weight. oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``) on a weight reordered ahead of time into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, with no batch size: the engine's changes every step) is what vLLM's
CPU build runs. Chosen by measurement: one decode step's projections of a ~100 M Qwen3 (hidden 768, 12 layers,
32,000-token tied head; every weight distinct, as in the engine), one thread, torch 2.13, AVX2 (AMD EPYC), ms
(medians; rows 1-2 and 8-32 from two runs of a shared VM: read across a row):

| rows | F.linear | oneDNN, packed | MKL packed sgemm | F.linear, transposed copy |
| ---: | ---: | ---: | ---: | ---: |
| 1 | 35.2 | 37.4 | 30.8 | 28.9 |
| 2 | 70.7 | 45.4 | 55.6 | 52.0 |
| 8 | 103 | 75.0 | 92.3 | 106 |
| 32 | 176 | 151 | 164 | 177 |

- oneDNN wins from two rows on for weights of 768 x 768 and more (the head: 32 against 55 ms at 32 rows), but a
  call costs ~30 us more than F.linear's, so smaller weights keep F.linear (``MIN_ELEMENTS``);
- at one row (decoding a single sequence) a transposed, contiguous copy of the weight wins (``x @ W.T`` streams
  it in storage order): the engine keeps one beside the pack, and decodes a single sequence of the 100 M model
  ~1.25x faster than through F.linear (in the engine, one thread); MKL's packed sgemm
  (``torch.ops.mkl._mkl_linear``) gains less there;
- MKL's packed sgemm is packed for one batch size and runs the unpacked sgemm at any other;
- bf16: oneDNN's packed bf16 needs AVX512 (or AVX-NE-CONVERT), so bf16 is left to F.linear, as is every device
  but the CPU; ``torch.backends.mkldnn`` has no switch that sends fp32 F.linear to oneDNN at full precision.

The model's parameters stay the source of truth: the packs are copies (twice as much memory again as the packed
weights: the blocked layout and the transposed matrix), made by ``pack_linears`` when the engine starts. A weight
version's packs are made from its tensors by the thread that hands it to the engine (``LinearPacks.packs_of``),
while steps go on, and installed with the version between two steps: the swap pauses decoding for the copy into
the parameters alone, and holds two versions' packs for that long. The packed ``nn.Linear`` modules and the output head (``CausalLM.head_linear``) are routed through
``linear``, which uses a pack only inside ``LinearPacks.active()`` on the calling thread (the engine's step): the
same model anywhere else, in the learner or in an engine with packing off, computes F.linear as before. Code
compiled by ``torch.compile`` (graph mode's decode step) runs F.linear: the packed layout is opaque to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from forge.model.qwen3 import CausalLM

log = logging.getLogger(__name__)

# A oneDNN call costs ~30 us more than F.linear's (ideep's descriptors and primitive-cache lookup, around a 3-15 us
# kernel): on one thread it loses up to 1024 x 128 weights at every batch, breaks even at 256 x 768, and wins from
# 768 x 768 (1.6x at 2 rows, 1.3x at 8).
MIN_ELEMENTS = 1 << 19

_active = threading.local()         # .packs: the packs of the engine step running on this thread, if any


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through the packed copies of ``weight`` when the calling thread has packs
    active that hold them: the transposed matrix for an ``x`` of one row, oneDNN's layout for more."""
    if not torch.compiler.is_compiling():
        packs: dict[int, Pack] | None = getattr(_active, "packs", None)
        entry = packs.get(id(weight)) if packs is not None else None
        if entry is not None and entry.weight is weight:
            if x.numel() == x.shape[-1]:
                return single_row_kernel(x, entry.transposed, bias)
            return packed_kernel(x, entry.packed, bias)
    return F.linear(x, weight, bias)


class Pack(NamedTuple):
    """The copies of one weight the engine's step computes with: oneDNN's blocked layout (two rows or more) and the
    transposed matrix, ``[in, out]`` and contiguous (one row)."""

    weight: Tensor
    packed: Tensor
    transposed: Tensor


def single_row_kernel(x: Tensor, transposed: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ transposed (+ bias)`` for an ``x`` of one row: a matrix-vector product that streams the weight in the
    order it is stored."""
    row = x.reshape(1, -1)
    out = torch.mm(row, transposed) if bias is None else torch.addmm(bias, row, transposed)
    return out.view(*x.shape[:-1], transposed.shape[1])


def packed_kernel(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """oneDNN's inner product of ``x`` with a weight packed by ``torch.ops.mkldnn._reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackableLinear(nn.Linear):
    """``nn.Linear`` whose forward is ``linear``: packed inside an engine step, plain everywhere else."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def supported(weight: Tensor) -> str:
    """Why weights like ``weight`` are not packed (empty when they are)."""
    if weight.device.type != "cpu":
        return f"the model is on {weight.device.type}"
    if weight.dtype != torch.float32:
        return f"{weight.dtype} is left to F.linear (no packed kernel that wins)"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return "this torch has no oneDNN"
    return ""


class LinearPacks:
    """The packed weights of one engine's model: those of its ``nn.Linear`` modules (MTP modules included) and, of a
    ``CausalLM``, its output head, each of at least ``min_elements`` elements (``MIN_ELEMENTS``)."""

    def __init__(self, model: nn.Module, min_elements: int | None = None) -> None:
        least = MIN_ELEMENTS if min_elements is None else min_elements
        modules = [m for m in model.modules() if type(m) in (nn.Linear, PackableLinear) and m.weight.numel() >= least]
        for module in modules:
            module.__class__ = PackableLinear        # same parameters and state dict; inert outside active()
        weights = {id(m.weight): m.weight for m in modules}
        if isinstance(model, CausalLM) and model.output_weight.numel() >= least:
            model.head_linear = linear
            weights.setdefault(id(model.output_weight), model.output_weight)     # tied: the embedding matrix
        self.weights = list(weights.values())
        names = {id(p): name for name, p in model.named_parameters()}
        self.names = [names[id(w)] for w in self.weights]
        self.packs: dict[int, Pack] = {}
        self.repack()

    @property
    def nbytes(self) -> int:
        """The memory the copies take: twice the packed weights'."""
        return 2 * sum(w.numel() * w.element_size() for w in self.weights)

    def repack(self) -> None:
        """Pack the weights' current values (after they were written in place). One matrix at a time: the old
        copies of each go as its new ones are made."""
        started = time.perf_counter()
        with torch.no_grad():
            for weight in self.weights:
                self.packs.pop(id(weight), None)
                self.packs[id(weight)] = _pack(weight, weight.detach())
        log.debug("packed %d linear weights in %.1f ms", len(self.weights), (time.perf_counter() - started) * 1e3)

    def packs_of(self, state_dict: Mapping[str, Tensor]) -> dict[int, Pack]:
        """The packs of a weight version before it is written into the model, from its tensors (by the model's
        parameter names): made by the thread that hands the version over, while the engine keeps stepping, so
        that the swap's pause is the copy alone (``install`` them once the weights are written)."""
        with torch.no_grad():
            return {id(weight): _pack(weight, state_dict[name].to(device=weight.device, dtype=weight.dtype))
                    for weight, name in zip(self.weights, self.names, strict=True)}

    def install(self, packs: dict[int, Pack]) -> None:
        """Use ``packs`` (from ``packs_of``) from the next step on."""
        self.packs.update(packs)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Route the model's linear projections on this thread through the packs until the block ends."""
        outer = getattr(_active, "packs", None)
        _active.packs = self.packs
        try:
            yield
        finally:
            _active.packs = outer


def _pack(weight: Tensor, value: Tensor) -> Pack:
    return Pack(weight, torch.ops.mkldnn._reorder_linear_weight(value, None), value.t().contiguous())


def pack_linears(model: CausalLM) -> LinearPacks | None:
    """The packs of ``model``'s linear weights, or None (logged) where packing does not apply or win."""
    reason = supported(model.output_weight)
    packs = None if reason else LinearPacks(model)
    if packs is not None and not packs.weights:
        reason, packs = f"no weight of {MIN_ELEMENTS} elements or more", None
    if packs is None:
        log.info("linear projections run through F.linear: %s", reason)
        return None
    log.info("%d linear projections run through oneDNN on packed weights (%.1f MiB more)", len(packs.weights),
             packs.nbytes / 2**20)
    return packs
