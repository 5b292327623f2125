"""Graph mode for decode steps: the model's forward over one new token per row, compiled by ``torch.compile``.

Eager decoding of a small model pays a fixed dispatch cost on each of its ~40 small ops per layer (norms, rotary,
activations, views); inductor fuses them into a few generated loops around the matmuls. Paged attention stays one
opaque op (``forge::paged_attention``): it writes the step's keys and values to their slots and attends, through
the C kernel on CPU or gather + SDPA elsewhere, so the compiled graph never sees the block layout. Batch size and
context length are dynamic; a batch of one row compiles once more (torch specialises sizes of 1). The first decode
step of each pays the compile (seconds); inductor caches the code on disk for later processes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import torch
from torch import Tensor

from forge.actors.engine.cpu_kernels import load as load_cpu_kernels
from forge.actors.engine.paged_attention import PagedAttention, PagedKVCache, StepLayout
from forge.model.attention import AttentionBackend
from forge.model.qwen3 import CausalLM

log = logging.getLogger(__name__)

_LIBRARY = torch.library.Library("forge", "DEF")          # defined once per process, at import
_LIBRARY.define("paged_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) keys, Tensor(b!) values, int layer, "
                "Tensor write_rows, Tensor write_slots, Tensor block_tables, Tensor query_slots, int key_lower, "
                "int block_size, float scale, bool native) -> Tensor")


def _paged_attention(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor, layer: int, write_rows: Tensor,
                     write_slots: Tensor, block_tables: Tensor, query_slots: Tensor, key_lower: int,
                     block_size: int, scale: float, native: bool) -> Tensor:
    layout = StepLayout(write_rows, write_slots, block_tables, query_slots, key_lower, block_size)
    return PagedAttention.attend_layer(keys[layer], values[layer], layout, load_cpu_kernels() if native else None, q,
                                       k, v, scale)


def _paged_attention_shape(q: Tensor, *_: object) -> Tensor:
    return torch.empty_like(q)


_LIBRARY.impl("paged_attention", _paged_attention, "CPU")
_LIBRARY.impl("paged_attention", _paged_attention, "CUDA")
_LIBRARY.impl("paged_attention", _paged_attention_shape, "Meta")


class _OpaquePagedAttention(AttentionBackend):
    """The paged backend as the compiled graph sees it: one op per layer over the whole cache tensors."""

    def __init__(self, keys: Tensor, values: Tensor, layout: StepLayout, native: bool) -> None:
        self.keys, self.values, self.layout, self.native = keys, values, layout, native

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        layout = self.layout
        return torch.ops.forge.paged_attention(q, k, v, self.keys, self.values, layer, layout.write_rows,
                                               layout.write_slots, layout.block_tables, layout.query_slots,
                                               layout.key_lower, layout.block_size, scale, self.native)


def _decode_forward(model: CausalLM, keys: Tensor, values: Tensor, input_ids: Tensor, position_ids: Tensor,
                    write_rows: Tensor, write_slots: Tensor, block_tables: Tensor, query_slots: Tensor, key_lower: int,
                    block_size: int, native: bool) -> Tensor:
    layout = StepLayout(write_rows, write_slots, block_tables, query_slots, key_lower, block_size)
    return model(input_ids, position_ids, _OpaquePagedAttention(keys, values, layout, native))


@functools.cache
def _compiled_forward() -> Callable[..., Tensor]:
    """One compiled function per process: engines of the same model (and cache shape) reuse its graphs."""
    return torch.compile(_decode_forward, dynamic=True, fullgraph=True)


class CompiledDecode:
    """``model(input_ids, position_ids, paged attention)`` for steps feeding one token per row, compiled once per
    process and model (plus once for a batch of one). Weights are read at call time: a weight swap, which copies
    into them in place, needs no recompile."""

    def __init__(self, model: CausalLM, cache: PagedKVCache, native: bool) -> None:
        self.model, self.cache, self.native = model, cache, native
        self.compiled_shapes: set[bool] = set()        # True: the graph for a batch of one row

    def __call__(self, input_ids: Tensor, position_ids: Tensor, layout: StepLayout) -> Tensor:
        single = input_ids.shape[0] == 1
        started = time.perf_counter()
        hidden = _compiled_forward()(self.model, self.cache.keys, self.cache.values, input_ids, position_ids,
                                     layout.write_rows, layout.write_slots, layout.block_tables, layout.query_slots,
                                     layout.key_lower, layout.block_size, self.native)
        if single not in self.compiled_shapes:
            self.compiled_shapes.add(single)
            log.info("decode graph%s ready in %.1f s (compiled, or loaded from inductor's cache)",
                     " for one row" if single else "", time.perf_counter() - started)
        return hidden
