"""Graph mode for decode steps: the model's forward over one new token per row, compiled by ``torch.compile``.

Eager decoding of a small model pays a fixed dispatch cost on each of its ~40 small ops per layer (norms, rotary,
activations, views); inductor fuses them into a few generated loops around the matmuls. Paged attention stays one
opaque op (``forge::paged_attention_v2``): it writes the step's keys and values to their slots and attends, through
the C kernel on CPU or gather + SDPA elsewhere, so the compiled graph never sees the block layout. Batch size and
context length are dynamic. The first decode step pays the compile (seconds); inductor caches the code on disk for
later processes. A model with experts is compiled with its routing recorded: the graph returns each sparse layer's
chosen experts beside the hidden states (its grouped expert multiply is an opaque op too, ``forge.model.moe``).
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
from forge.model.moe import Routing
from forge.model.qwen3 import CausalLM

log = logging.getLogger(__name__)

# Inductor's on-disk cache knows the op by its name, not by what its shape function returns: a change to the op's
# output (its layout included) must come with a new name, or graphs compiled for the old one are reused.
OP = "paged_attention_v2"
_LIBRARY = torch.library.Library("forge", "DEF")          # defined once per process, at import
_LIBRARY.define(f"{OP}(Tensor q, Tensor k, Tensor v, Tensor(a!) keys, Tensor(b!) values, int layer, "
                "Tensor write_rows, Tensor write_slots, Tensor block_tables, Tensor query_slots, int key_lower, "
                "int block_size, float scale, bool native) -> Tensor")


def _paged_attention(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor, layer: int, write_rows: Tensor,
                     write_slots: Tensor, block_tables: Tensor, query_slots: Tensor, key_lower: int,
                     block_size: int, scale: float, native: bool) -> Tensor:
    layout = StepLayout(write_rows, write_slots, block_tables, query_slots, key_lower, block_size)
    out = PagedAttention.attend_layer(keys[layer], values[layer], layout, load_cpu_kernels() if native else None, q,
                                      k, v, scale)
    return out.contiguous()                 # the layout the graph was traced with, whichever path ran


def _paged_attention_shape(q: Tensor, *_: object) -> Tensor:
    return q.new_empty(q.shape)


_LIBRARY.impl(OP, _paged_attention, "CPU")
_LIBRARY.impl(OP, _paged_attention, "CUDA")
_LIBRARY.impl(OP, _paged_attention_shape, "Meta")


class _OpaquePagedAttention(AttentionBackend):
    """The paged backend as the compiled graph sees it: one op per layer over the whole cache tensors."""

    def __init__(self, keys: Tensor, values: Tensor, layout: StepLayout, native: bool) -> None:
        self.keys, self.values, self.layout, self.native = keys, values, layout, native

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        layout = self.layout
        return getattr(torch.ops.forge, OP)(q, k, v, self.keys, self.values, layer, layout.write_rows,
                                            layout.write_slots, layout.block_tables, layout.query_slots,
                                            layout.key_lower, layout.block_size, scale, self.native)


def _decode_forward(model: CausalLM, keys: Tensor, values: Tensor, input_ids: Tensor, position_ids: Tensor,
                    write_rows: Tensor, write_slots: Tensor, block_tables: Tensor, query_slots: Tensor, key_lower: int,
                    block_size: int, native: bool) -> Tensor:
    layout = StepLayout(write_rows, write_slots, block_tables, query_slots, key_lower, block_size)
    return model(input_ids, position_ids, _OpaquePagedAttention(keys, values, layout, native))


def _routed_decode_forward(model: CausalLM, keys: Tensor, values: Tensor, input_ids: Tensor, position_ids: Tensor,
                           write_rows: Tensor, write_slots: Tensor, block_tables: Tensor, query_slots: Tensor,
                           key_lower: int, block_size: int, native: bool) -> tuple[Tensor, Tensor]:
    """``_decode_forward`` of a model with experts: the hidden states and the chosen experts [sparse layers, rows, k]."""
    layout = StepLayout(write_rows, write_slots, block_tables, query_slots, key_lower, block_size)
    routing = Routing(record=True)
    hidden = model(input_ids, position_ids, _OpaquePagedAttention(keys, values, layout, native), routing)
    return hidden, routing.stack()


@functools.cache
def _compiled_forward(routed: bool) -> Callable[..., Tensor | tuple[Tensor, Tensor]]:
    """One compiled function per process and kind: engines of the same model reuse its graphs."""
    return torch.compile(_routed_decode_forward if routed else _decode_forward, dynamic=True, fullgraph=True)


class CompiledDecode:
    """``model(input_ids, position_ids, paged attention)`` for steps feeding one token per row, compiled once per
    process and model. Weights are read at call time: a weight swap, which copies into them in place, needs no
    recompile.

    Checking every guard of the compiled function costs ~0.2 ms a step on CPU (the model's modules and parameters
    are among its inputs). What can change between the steps of one engine is only shapes, which the graph takes as
    dynamic; what may differ between engines (the model, the attention path) is settled by each engine's first
    call, made under full guards. Later calls check only the guards that tell the cached graphs apart (torch's
    ``skip_guard_eval_unsafe`` stance), and fall back to full guards (and a compile) if none fits."""

    def __init__(self, model: CausalLM, cache: PagedKVCache, native: bool) -> None:
        self.model, self.cache, self.native = model, cache, native
        self.routed = cache.routing is not None
        self.warm = False

    def __call__(self, input_ids: Tensor, position_ids: Tensor, layout: StepLayout) -> tuple[Tensor, Tensor | None]:
        """The step's hidden states, and for a model with experts its chosen experts [sparse layers, rows, k]."""
        rows = input_ids.shape[0]
        if rows == 1:
            input_ids, position_ids, layout = _two_rows(input_ids, position_ids, layout)
        tables = layout.block_tables
        if tables.shape[1] == 1:
            tables = tables.repeat(1, 2)            # a filler column: no query sees past its own last slot
        args = (self.model, self.cache.keys, self.cache.values, input_ids, position_ids, layout.write_rows,
                layout.write_slots, tables, layout.query_slots, layout.key_lower, layout.block_size, self.native)
        out = self._run(args)
        if self.routed:
            hidden, chosen = out
            return hidden[:rows], chosen[:, :rows]
        return out[:rows], None

    def _run(self, args: tuple) -> Tensor | tuple[Tensor, Tensor]:
        if self.warm:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return _compiled_forward(self.routed)(*args)
            except RuntimeError as error:      # raised before the graph runs: nothing was written
                if "skip_guard_eval_unsafe" not in str(error):
                    raise
                log.info("decode step: a new graph variant (%s); compiling it", type(error).__name__)
        started = time.perf_counter()
        # Traced without duck sizing: a batch of 2 rows must not tie the batch size to a cache dimension that is 2
        # as well (a setting read while tracing, so set only around calls that may trace).
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            out = _compiled_forward(self.routed)(*args)
        if not self.warm:
            self.warm = True
            log.info("decode graph ready in %.1f s (compiled, or loaded from inductor's cache)",
                     time.perf_counter() - started)
        return out


def _two_rows(input_ids: Tensor, position_ids: Tensor, layout: StepLayout) -> tuple[Tensor, Tensor, StepLayout]:
    """A batch of one row as two copies of it (the second writes the first's keys and values to the same slots), so
    that no size is 1: torch would otherwise specialise a graph for it."""
    write_rows = torch.cat([layout.write_rows, layout.write_rows])
    write_slots = torch.cat([layout.write_slots, layout.write_slots])
    doubled = StepLayout(write_rows, write_slots, layout.block_tables.repeat(2, 1), layout.query_slots.repeat(2, 1),
                         layout.key_lower, layout.block_size)
    return input_ids.repeat(2, 1), position_ids.repeat(2, 1), doubled
