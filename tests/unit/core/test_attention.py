"""Attention backends: packed sequences, prefix trees and the dense KV cache give exactly the logits of plain
causal forward passes over the corresponding linear sequences."""

from __future__ import annotations

import random

import pytest
import torch

from forge.model import CausalLM, DenseKVCache, MaskedAttention
from forge.model.attention import ancestor_mask

from helpers.random_model import random_model, small_config

CONFIG = small_config(intermediate_size=96, num_hidden_layers=3)


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return random_model(CONFIG, std=0.1)


def linear_logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model(torch.tensor([ids])))[0]


def test_packed_segments_equal_separate_sequences(model):
    rng = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 101, (n,), generator=rng).tolist() for n in (5, 11, 1, 8)]
    ids = torch.tensor([[t for s in seqs for t in s]])
    positions = torch.tensor([[p for s in seqs for p in range(len(s))]])
    segments = torch.tensor([[i for i, s in enumerate(seqs) for _ in s]])
    with torch.no_grad():
        packed = model.logits(model(ids, positions, MaskedAttention.from_segments(segments)))[0]
    offset = 0
    for seq in seqs:
        torch.testing.assert_close(packed[offset:offset + len(seq)], linear_logits(model, seq), atol=1e-5, rtol=0)
        offset += len(seq)


def random_tree(rng: random.Random, size: int) -> tuple[list[int], list[int]]:
    """Tokens and parent indices of a random tree in depth-first order."""
    parents, tokens, stack = [], [], []
    for i in range(size):
        while stack and rng.random() < 0.3:
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        tokens.append(rng.randrange(101))
        stack.append(i)
    return tokens, parents


@pytest.mark.parametrize("seed", range(4))
def test_tree_packing_equals_every_root_to_node_path(model, seed):
    rng = random.Random(seed)
    tokens, parents = random_tree(rng, 40)
    depth = []
    for parent in parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    with torch.no_grad():
        tree = model.logits(model(torch.tensor([tokens]), torch.tensor([depth]), MaskedAttention.from_parents(
            torch.tensor(parents))))[0]
    for node in range(len(tokens)):
        path = []
        walk = node
        while walk >= 0:
            path.append(walk)
            walk = parents[walk]
        path.reverse()
        expected = linear_logits(model, [tokens[i] for i in path])[-1]
        torch.testing.assert_close(tree[node], expected, atol=1e-5, rtol=0)


def test_dense_kv_cache_matches_full_forward_including_mtp(model):
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(20).expand(2, 20)
    with torch.no_grad():
        hidden = model(ids)
        full = model.logits(hidden)
        full_mtp = model.mtp_logits(model.mtp_forward(hidden[:, :-1], ids[:, 1:]))
        cache = DenseKVCache(CONFIG.num_layers_with_mtp)
        pieces, mtp_pieces, start = [], [], 0
        for end in (7, 8, 9, 13, 20):      # a chunked prefill, then single tokens, then a chunk again
            h = model(ids[:, start:end], positions[:, start:end], cache)
            pieces.append(model.logits(h))
            mtp_end = min(end, 19)
            if mtp_end > start:
                mtp_h = model.mtp_forward(h[:, : mtp_end - start], ids[:, start + 1: mtp_end + 1],
                                          position_ids=positions[:, start:mtp_end], attention=cache)
                mtp_pieces.append(model.mtp_logits(mtp_h))
            start = end
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(mtp_pieces, dim=1), full_mtp, atol=1e-5, rtol=0)


def test_ancestor_mask_and_validation():
    mask = ancestor_mask([-1, 0, 1, 0, -1])
    assert mask.tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [True, True, True, False, False],
        [True, False, False, True, False],
        [False, False, False, False, True],
    ]
    with pytest.raises(ValueError, match="before their children"):
        ancestor_mask([-1, 2, 0])
    with pytest.raises(ValueError, match="at least one key"):
        MaskedAttention(torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        MaskedAttention(torch.ones(3, 3))
