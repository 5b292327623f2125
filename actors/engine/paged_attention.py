"""The paged KV cache storage and the attention backend that reads and writes it.

Keys and values of every layer live in one tensor per kind, [layers, blocks, block_size, kv_heads, head_dim]; a
token's slot is ``block_table[pos // block_size] * block_size + pos % block_size``. A step feeds a padded batch
[B, T] of new tokens: their keys and values are written to their slots first, then each row's blocks are gathered
whole (one contiguous copy per block) and every query attends to the keys its mask allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.model.attention import AttentionBackend


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass
class StepLayout:
    """Where a step's tokens go and what they see (shared by every layer of one forward pass)."""

    write_rows: Tensor      # [W] indices into the flattened [B*T] new tokens whose KV is written
    write_slots: Tensor     # [W] their cache slots
    block_tables: Tensor    # [B, N] blocks of each row (padded with any valid block)
    mask: Tensor            # [B, 1, T, N * block_size] True where query t of row b may attend key j


class PagedAttention(AttentionBackend):
    def __init__(self, cache: PagedKVCache, layout: StepLayout) -> None:
        self.cache = cache
        self.layout = layout

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        layout = self.layout
        batch, kv_heads, length, dim = k.shape
        key_cache, value_cache = self.cache.keys[layer], self.cache.values[layer]
        if layout.write_rows.numel():
            new_k = k.transpose(1, 2).reshape(batch * length, kv_heads, dim)
            new_v = v.transpose(1, 2).reshape(batch * length, kv_heads, dim)
            key_cache.view(-1, kv_heads, dim).index_copy_(0, layout.write_slots,
                                                          new_k.index_select(0, layout.write_rows))
            value_cache.view(-1, kv_heads, dim).index_copy_(0, layout.write_slots,
                                                            new_v.index_select(0, layout.write_rows))
        blocks = layout.block_tables.reshape(-1)
        keys = key_cache.index_select(0, blocks).view(batch, -1, kv_heads, dim).transpose(1, 2)
        values = value_cache.index_select(0, blocks).view(batch, -1, kv_heads, dim).transpose(1, 2)
        gqa = q.shape[1] != kv_heads
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=layout.mask, scale=scale, enable_gqa=gqa)
