"""The paged KV cache storage and the attention backend that reads and writes it.

Keys and values of every layer live in one tensor per kind, [layers, blocks, block_size, kv_heads, head_dim]; a
token's slot is ``block_table[pos // block_size] * block_size + pos % block_size``. A step feeds a padded batch
[B, T] of new tokens: their keys and values are written to their slots first, then each row's blocks are gathered
whole (one contiguous copy per block) and every query attends to the keys its mask allows. On CPU, steps of a few
queries per row (decoding, verifying a draft) read the cache in place with a compiled kernel instead
(``cpu_kernels``), which skips the copies.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.actors.engine.cpu_kernels import paged_attention
from forge.model.attention import AttentionBackend

KERNEL_MAX_QUERIES = 8          # rows feeding more tokens (prefill) run the gather + SDPA path, matmul-bound


class PagedKVCache:
    """Keys and values per slot, and for a model with experts (``routing`` = (sparse layers, top_k)) the expert ids
    each sparse layer chose at the slot's position (-1 where the slot's KV was not computed here): kept beside the
    KV so that prefix hits know the routing of the positions they reuse."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, routing: tuple[int, int] | None = None) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.routing = None if routing is None else torch.full((num_blocks * block_size, *routing), -1,
                                                               dtype=torch.int32, device=device)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype, routing: tuple[int, int] | None = None) -> int:
        kv = 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        return kv + (block_size * routing[0] * routing[1] * 4 if routing else 0)

    def store_routing(self, layout: StepLayout, chosen: Tensor) -> None:
        """Keep the routing of a step's written slots: ``chosen`` [layers, B * T, top_k] of its flattened tokens."""
        if self.routing is not None and layout.write_rows.numel():
            self.routing[layout.write_slots] = chosen[:, layout.write_rows].transpose(0, 1).to(torch.int32)

    def block_routing(self, block_id: int) -> Tensor:
        """The routing [block_size, layers, top_k] of one block's slots (a view)."""
        return self.routing[block_id * self.block_size:(block_id + 1) * self.block_size]

    def install_routing(self, block_id: int, ids: Tensor | None) -> None:
        """Routing for a block whose KV was written from elsewhere (the L3 cache): ``ids`` [block_size, layers,
        top_k] as the actor that computed the KV routed it, or None where that is not known (-1)."""
        if self.routing is not None:
            target = self.block_routing(block_id)
            if ids is None:
                target.fill_(-1)
            else:
                target.copy_(ids)

    def routing_of(self, block_table: list[int], positions: int) -> Tensor:
        """The routing [positions, layers, top_k] of a sequence's first ``positions`` positions."""
        size, device = self.block_size, self.routing.device
        at = torch.arange(positions, device=device)
        table = torch.tensor(block_table[:-(-positions // size)], dtype=torch.long, device=device)
        return self.routing[table[at // size] * size + at % size]


@dataclass
class StepLayout:
    """Where a step's tokens go and what they see (shared by every layer of one forward pass): query t of row b sees
    slots ``key_lower`` .. ``query_slots[b, t]`` of the blocks in ``block_tables[b]``."""

    write_rows: Tensor      # [W] indices into the flattened [B*T] new tokens whose KV is written
    write_slots: Tensor     # [W] their cache slots
    block_tables: Tensor    # [B, N] blocks of each row (padded with any valid block)
    query_slots: Tensor     # [B, T] the last slot each query sees
    key_lower: int          # the first slot every query sees
    block_size: int

    @functools.cached_property
    def mask(self) -> Tensor:
        """[B, 1, T, N * block_size]: True where query t of row b may attend key j (built only if SDPA runs)."""
        positions = torch.arange(self.block_tables.shape[1] * self.block_size, device=self.query_slots.device)
        return ((positions <= self.query_slots.unsqueeze(-1)) & (positions >= self.key_lower)).unsqueeze(1)


class PagedAttention(AttentionBackend):
    def __init__(self, cache: PagedKVCache, layout: StepLayout, kernel: ctypes.CDLL | None = None) -> None:
        self.cache = cache
        self.layout = layout
        self.kernel = kernel            # the compiled CPU kernels, when built (fp32 caches only)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        return self.attend_layer(self.cache.keys[layer], self.cache.values[layer], self.layout, self.kernel, q, k, v,
                                 scale)

    @staticmethod
    def attend_layer(key_cache: Tensor, value_cache: Tensor, layout: StepLayout, kernel: ctypes.CDLL | None,
                     q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        """Write the step's keys and values into one layer's cache, then attend over it."""
        batch, kv_heads, length, dim = k.shape
        if layout.write_rows.numel():
            new_k = k.transpose(1, 2).reshape(batch * length, kv_heads, dim)
            new_v = v.transpose(1, 2).reshape(batch * length, kv_heads, dim)
            key_cache.view(-1, kv_heads, dim).index_copy_(0, layout.write_slots,
                                                          new_k.index_select(0, layout.write_rows))
            value_cache.view(-1, kv_heads, dim).index_copy_(0, layout.write_slots,
                                                            new_v.index_select(0, layout.write_rows))
        if kernel is not None and length <= KERNEL_MAX_QUERIES:
            return paged_attention(kernel, q, key_cache, value_cache, layout.block_tables, layout.query_slots,
                                   layout.key_lower, scale)
        blocks = layout.block_tables.reshape(-1)
        keys = key_cache.index_select(0, blocks).view(batch, -1, kv_heads, dim).transpose(1, 2)
        values = value_cache.index_select(0, blocks).view(batch, -1, kv_heads, dim).transpose(1, 2)
        gqa = q.shape[1] != kv_heads
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=layout.mask, scale=scale, enable_gqa=gqa)
