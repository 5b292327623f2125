"""Prefix-tree merging, structure: the trie in pre-order, packing under a token budget, and the tree attention
backends (dense, per-block gather, flex BlockMask) against the ancestor mask."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from forge.learner.samples import Sample
from forge.learner.tree import BorrowedKeys, TreeAttention, build_trie, flex, pack_trees, plan_runs, segments
from forge.learner.tree.flex import FLEX_BLOCK
from forge.learner.tree.mask import allowed
from forge.model.attention import ancestor_mask

from helpers.threads import one_thread  # noqa: F401  (autouse)


def random_sequences(rng: random.Random, alphabet: int = 4) -> list[list[int]]:
    base = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 14))]
    sequences = []
    for _ in range(rng.randrange(1, 10)):
        keep = rng.randrange(0, len(base) + 1)
        sequence = base[:keep] + [rng.randrange(alphabet) for _ in range(rng.randrange(0 if keep else 1, 6))]
        sequences.append(sequence)
        if rng.random() < 0.5:
            base = sequence
    return sequences


def brute_force_nodes(sequences: list[list[int]]) -> list[tuple[int, ...]]:
    """Every distinct prefix; sorted tuples are the pre-order of the trie (a prefix before its extensions)."""
    return sorted({tuple(s[: d + 1]) for s in sequences for d in range(len(s))})


@pytest.mark.parametrize("seed", range(60))
def test_trie_equals_brute_force(seed):
    sequences = random_sequences(random.Random(seed))
    trie = build_trie(sequences)
    nodes = brute_force_nodes(sequences)
    index = {node: i for i, node in enumerate(nodes)}
    assert trie.num_nodes == len(nodes)
    assert trie.num_sample_tokens == sum(map(len, sequences))
    for i, node in enumerate(nodes):
        assert trie.tokens[i] == node[-1] and trie.depth[i] == len(node) - 1
        assert trie.parent[i] == (index[node[:-1]] if len(node) > 1 else -1)
        subtree = [j for j, other in enumerate(nodes) if other[: len(node)] == node]
        assert subtree == list(range(i, int(trie.end[i])))
    for sequence, path in zip(sequences, trie.paths, strict=True):
        assert path.tolist() == [index[tuple(sequence[: d + 1])] for d in range(len(sequence))]
    through = trie.multiplicity()
    for i, node in enumerate(nodes):
        holders = [k for k, s in enumerate(sequences) if tuple(s[: len(node)]) == node]
        assert trie.samples_through(i) == holders and through[i] == len(holders)


def test_groups_sessions_and_branches_merge():
    system, task = [5, 6, 7, 8], [9]
    call0 = [*system, *task, 1, 2]                    # prompt system+task, completion 1 2
    call1 = [*call0, 3, 4, 4]                         # prompt extends call 0; completion 4
    rollout = [*system, *task, 1, 3]                  # another rollout: branches after its first sampled token
    rewrite = [*system, 0, 4, 4]                      # context management: history replaced by a summary
    trie = build_trie([call0, call1, rollout, rewrite, call0])
    assert trie.num_sample_tokens == 7 + 10 + 7 + 7 + 7
    assert trie.num_nodes == 5 + 2 + 3 + 1 + 3       # system+task, 1 2, 3 4 4, 3, 0 4 4
    assert trie.paths[0].tolist() == trie.paths[4].tolist() == trie.paths[1][:7].tolist()
    assert trie.compression == pytest.approx(38 / 14)
    with pytest.raises(ValueError):
        build_trie([[]])


def make_sample(tokens: list[int], prompt_len: int) -> Sample:
    count = len(tokens) - prompt_len
    return Sample(tokens, prompt_len, [-1.0] * count, [0] * count, 0.5, 1.0, 0, 1.0, "", 0, "s", 0)


@pytest.mark.parametrize("budget", [1, 8, 20, 1000])
def test_runs_cover_every_sample_once_within_the_budget(budget):
    rng = random.Random(budget)
    sequences = [s for _ in range(5) for s in random_sequences(rng, alphabet=3)]
    samples = [make_sample(s, max(1, len(s) // 2)) for s in sequences]
    batches = pack_trees(samples, budget)
    assert sorted(id(s) for b in batches for s in b.samples) == sorted(id(s) for s in samples)
    for batch in batches:
        longest = max(len(s.tokens) for s in batch.samples)
        assert batch.num_nodes <= max(budget, longest)
        assert len(batch.samples) == 1 or batch.num_nodes <= budget
        # The packed sequence is a valid tree in pre-order containing every sample's whole path.
        parent, end = batch.parent.tolist(), batch.end.tolist()
        assert all(p < i for i, p in enumerate(parent))
        torch.testing.assert_close(TreeAttention(batch.end, impl="dense").dense_mask(), ancestor_mask(parent))
        assert all(i < e <= len(parent) for i, e in enumerate(end))
    trie = build_trie(sequences)
    runs = plan_runs(trie, budget)
    assert runs[0][0] == 0 and runs[-1][1] == len(sequences)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))


def random_tree(rng: random.Random, size: int, chain: float) -> list[int]:
    """Parent indices of a random tree in pre-order, long chains (agent sessions) when ``chain`` is high."""
    parents, stack = [], []
    for i in range(size):
        while stack and rng.random() > chain:
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        stack.append(i)
    return parents


def session_tree(rng: random.Random, size: int) -> list[int]:
    """A shared prompt, then chains (rollouts, calls) branching off the previous path at random depths."""
    parents: list[int] = []
    path: list[int] = []
    while len(parents) < size:
        del path[rng.randrange(min(len(path), 20), len(path) + 1):]
        for _ in range(rng.randrange(5, 90)):
            parents.append(path[-1] if path else -1)
            path.append(len(parents) - 1)
    return parents[:size]


def tree_end(parents: list[int]) -> torch.Tensor:
    end = list(range(1, len(parents) + 1))
    for i in reversed(range(len(parents))):
        if parents[i] >= 0:
            end[parents[i]] = max(end[parents[i]], end[i])
    return torch.tensor(end)


def assert_block_structure(block_mask, pairs: torch.Tensor) -> None:
    """The compiled kernel trusts the block structure: every visible pair (``pairs`` among the tree's slots, plus
    every slot with itself, padding included) must lie in a listed block, and a block listed as full must be wholly
    visible."""
    dense_blocks = block_mask.to_dense()[0, 0].bool()
    padded = dense_blocks.shape[0] * FLEX_BLOCK
    size = pairs.shape[0]
    visible = torch.zeros(padded, padded, dtype=torch.bool)
    visible[:size, :size] = pairs
    visible |= torch.eye(padded, dtype=torch.bool)
    per_block = visible.view(padded // FLEX_BLOCK, FLEX_BLOCK, padded // FLEX_BLOCK, FLEX_BLOCK)
    assert not (per_block.any(-1).any(1) & ~dense_blocks).any()
    full_blocks = torch.zeros_like(dense_blocks)
    for row in range(dense_blocks.shape[0]):
        count = int(block_mask.full_kv_num_blocks[0, 0, row])
        full_blocks[row, block_mask.full_kv_indices[0, 0, row, :count].long()] = True
    assert (per_block.all(-1).all(1) | ~full_blocks).all()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mtp", [False, True])
def test_tree_attention_implementations_equal_the_ancestor_mask(seed, mtp):
    rng = random.Random(seed)
    size = rng.randrange(200, 420)
    parents = session_tree(rng, size) if seed % 3 == 2 else random_tree(rng, size, chain=[0.6, 0.99][seed % 3])
    end = tree_end(parents)
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    depth = torch.tensor(depths)
    key_ok = depth > 0 if mtp else None
    expected = ancestor_mask(parents)
    if mtp:
        expected &= (depth > 0).unsqueeze(0) | torch.eye(len(parents), dtype=torch.bool)
    torch.testing.assert_close(TreeAttention(end, key_ok, impl="dense").dense_mask(), expected)
    generator = torch.Generator().manual_seed(seed)
    size = len(parents)
    q = torch.randn(1, 4, size, 8, generator=generator, requires_grad=True)
    k = torch.randn(1, 2, size, 8, generator=generator, requires_grad=True)
    v = torch.randn(1, 2, size, 8, generator=generator, requires_grad=True)
    weights = torch.randn(1, 4, size, 8, generator=generator)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=expected, scale=0.3, enable_gqa=True)
    reference_grads = torch.autograd.grad((reference * weights).sum(), (q, k, v))
    for impl in ("segments", "gather"):
        for block_size in (16, 64, 1000):
            out = TreeAttention(end, key_ok, impl=impl, block_size=block_size).attend(0, q, k, v, 0.3)
            torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
            grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
            for grad, ref in zip(grads, reference_grads, strict=True):       # fp32 rounding, relative to |grad| ~5
                torch.testing.assert_close(grad, ref, atol=1e-5, rtol=1.3e-6)
    eager = TreeAttention(end, key_ok, impl="flex", compile_flex=False)
    with torch.no_grad():     # torch 2.13 has no flex backward on CPU; eager flex checks the mask_mod
        torch.testing.assert_close(eager.attend(0, q, k, v, 0.3), reference, atol=1e-5, rtol=0)
    assert_block_structure(flex.block_mask(end, key_ok), expected)


def test_flex_lengths_fall_in_few_compiled_shapes():
    """The compiled flex kernel has static shapes: every length pads to one of a handful, at most doubling it."""
    lengths = range(1, 20_000)
    for length in lengths:
        padded = flex.padded_length(length)
        assert padded >= length and padded % FLEX_BLOCK == 0 and (padded < 2 * length or padded == FLEX_BLOCK)
    assert {flex.padded_length(n) for n in lengths} == {FLEX_BLOCK << k for k in range(9)}


@pytest.mark.slow
def test_compiled_flex_kernel_follows_the_block_mask():
    """The compiled kernel (forward only on CPU in torch 2.13; forward and backward on CUDA) skips the blocks the
    BlockMask leaves out, so this checks the block structure end to end. Compiling takes ~10-30 s."""
    rng = random.Random(7)
    parents = session_tree(rng, 700)
    end = tree_end(parents)
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, len(parents), 16, generator=generator)
    k = torch.randn(1, 2, len(parents), 16, generator=generator)
    v = torch.randn(1, 2, len(parents), 16, generator=generator)
    with torch.no_grad():
        expected = TreeAttention(end, impl="dense").attend(0, q, k, v, 0.25)
        got = TreeAttention(end, impl="flex").attend(0, q, k, v, 0.25)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # Borrowed slots (here every third slot and the first 150, read from the full keys as the stem): the compiled
    # kernel skips the blocks of borrowed rows but for their diagonal, and gives the computed rows.
    taken = torch.zeros(len(parents), dtype=torch.bool)
    taken[:150] = True
    taken[::3] = True
    computed, borrowed = (~taken).nonzero().squeeze(-1), taken.nonzero().squeeze(-1)
    order = torch.empty(len(parents), dtype=torch.long)
    order[computed] = torch.arange(computed.numel())
    order[borrowed] = computed.numel() + torch.arange(borrowed.numel())
    attention = TreeAttention(end, impl="flex", queries=computed,
                              borrow=BorrowedKeys({0: (k, v)}, borrowed, order))
    with torch.no_grad():
        got = attention.attend(0, q[:, :, computed], k[:, :, computed], v[:, :, computed], 0.25)
    torch.testing.assert_close(got, expected[:, :, computed], atol=1e-5, rtol=0)


def agent_tree(rng: random.Random) -> list[int]:
    """A prompt chain, rollouts chained below it, and rewrites branching off each rollout's path."""
    parents = [i - 1 for i in range(rng.randrange(70, 120))]
    fork = len(parents) - 1
    for _ in range(rng.randrange(3, 6)):
        path = [fork]
        for _ in range(rng.randrange(60, 160)):
            parents.append(path[-1])
            path.append(len(parents) - 1)
        branch = rng.choice(path)
        for _ in range(rng.randrange(30, 80)):
            parents.append(branch)
            branch = len(parents) - 1
    return parents


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mtp", [False, True])
@pytest.mark.parametrize("subset", [False, True])
def test_segments_attend_to_a_fork_run_once_for_all_the_blocks_below_it(seed, mtp, subset):
    """The segments plan attends each run above a fork once for every block below the fork (one kernel call over
    their rows); with chain blocks far smaller than the tree it must still equal the ancestor mask, gradients
    included, for all queries or a subset."""
    rng = random.Random(seed + 70)
    parents = agent_tree(rng)
    size = len(parents)
    end = tree_end(parents)
    depth = torch.tensor([len(list(_path(parents, node))) for node in range(size)])
    key_ok = depth > 0 if mtp else None
    queries = torch.tensor(sorted(rng.sample(range(size), size // 2))) if subset else None
    parts = segments.plan_segments(end, key_ok, 16, torch.float32, min_run=16, queries=queries, chain_size=32)
    rows = size if queries is None else queries.numel()
    shared = [p for p in parts if p.keys is None and not p.causal]
    prompt = next(node for node in range(1, size) if parents[node] != node - 1 or end[node] < end[node - 1])
    below = size - prompt if queries is None else int((queries >= prompt).sum())
    assert [p.row_stop - p.row_start for p in shared if p.stop == prompt] == [below]    # one call for them all
    nodes = torch.arange(size)
    mask = allowed(nodes if queries is None else queries, nodes, end, key_ok)
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, rows, 8, generator=generator, requires_grad=True)
    k = torch.randn(1, 2, size, 8, generator=generator, requires_grad=True)
    v = torch.randn(1, 2, size, 8, generator=generator, requires_grad=True)
    weights = torch.randn(1, 4, rows, 8, generator=generator)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    reference_grads = torch.autograd.grad((reference * weights).sum(), (q, k, v))
    out = segments.attend_segments(parts, q, k, v, 0.3)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
    for grad, ref in zip(torch.autograd.grad((out * weights).sum(), (q, k, v)), reference_grads, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-5, rtol=0)


def _path(parents: list[int], node: int):
    """Strict ancestors of ``node``, nearest first."""
    while (node := parents[node]) >= 0:
        yield node


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mtp", [False, True])
def test_borrowed_slots_attend_as_if_computed(seed, mtp):
    """A tree whose slots are partly borrowed (queries for the rest only; keys and values of the borrowed slots read
    from rows of a larger stem tensor): every implementation gives the computed rows of full-tree attention, and
    the gradients of q, of the tree's own keys and values and of the stem's rows."""
    rng = random.Random(seed + 40)
    parents = session_tree(rng, 300) if seed % 2 else random_tree(rng, 300, chain=0.9)
    size = len(parents)
    end = tree_end(parents)
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    key_ok = torch.tensor(depths) > 0 if mtp else None
    borrowed = sorted(set(range(rng.randrange(20, 120))) | set(rng.sample(range(size), 60)))
    computed = torch.tensor([i for i in range(size) if i not in set(borrowed)])
    borrowed_t = torch.tensor(borrowed)
    order = torch.empty(size, dtype=torch.long)
    order[computed] = torch.arange(computed.numel())
    order[borrowed_t] = computed.numel() + torch.arange(len(borrowed))
    stem_size = len(borrowed) + 50
    stem_rows = torch.randperm(stem_size, generator=torch.Generator().manual_seed(seed))[:len(borrowed)]
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, size, 8, generator=generator)
    k = torch.randn(1, 2, size, 8, generator=generator)
    v = torch.randn(1, 2, size, 8, generator=generator)
    weights = torch.randn(1, 4, computed.numel(), 8, generator=generator)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = TreeAttention(end, key_ok, impl="dense").dense_mask()
    reference = torch.nn.functional.scaled_dot_product_attention(
        *full, attn_mask=mask, scale=0.3, enable_gqa=True)[:, :, computed]
    ref_q, ref_k, ref_v = torch.autograd.grad((reference * weights).sum(), full)

    def inputs():
        stem_k = torch.randn(1, 2, stem_size, 8, generator=generator)
        stem_v = torch.randn(1, 2, stem_size, 8, generator=generator)
        stem_k[:, :, stem_rows], stem_v[:, :, stem_rows] = k[:, :, borrowed_t], v[:, :, borrowed_t]
        own = [t[:, :, computed].clone().requires_grad_() for t in (q, k, v)]
        stem = [stem_k.requires_grad_(), stem_v.requires_grad_()]
        return own, stem

    for impl, block_size in [("dense", 256), ("segments", 16), ("segments", 64), ("gather", 16), ("gather", 1000)]:
        own, stem = inputs()
        borrow = BorrowedKeys({3: (stem[0], stem[1])}, stem_rows, order)
        attention = TreeAttention(end, key_ok, impl=impl, block_size=block_size, queries=computed, borrow=borrow)
        out = attention.attend(3, *own, 0.3)
        torch.testing.assert_close(out, reference, atol=1e-5, rtol=0, msg=impl)
        gq, gk, gv, gsk, gsv = torch.autograd.grad((out * weights).sum(), (*own, *stem))
        torch.testing.assert_close(gq, ref_q[:, :, computed], atol=1e-5, rtol=0)
        torch.testing.assert_close(gk, ref_k[:, :, computed], atol=1e-5, rtol=0)
        torch.testing.assert_close(gv, ref_v[:, :, computed], atol=1e-5, rtol=0)
        torch.testing.assert_close(gsk[:, :, stem_rows], ref_k[:, :, borrowed_t], atol=1e-5, rtol=0)
        torch.testing.assert_close(gsv[:, :, stem_rows], ref_v[:, :, borrowed_t], atol=1e-5, rtol=0)
        unused = torch.ones(stem_size, dtype=torch.bool)
        unused[stem_rows] = False
        assert not gsk[:, :, unused].any() and not gsv[:, :, unused].any()
    own, stem = inputs()
    eager = TreeAttention(end, key_ok, impl="flex", compile_flex=False, queries=computed,
                          borrow=BorrowedKeys({0: (stem[0], stem[1])}, stem_rows, order))
    with torch.no_grad():
        torch.testing.assert_close(eager.attend(0, *own, 0.3), reference, atol=1e-5, rtol=0)
    # Blocks of borrowed rows only are skipped but for their diagonal; every visible pair lies in a listed block.
    pairs = torch.zeros(size, size, dtype=torch.bool)
    pairs[computed] = mask[computed]
    assert_block_structure(flex.block_mask(end, key_ok, computed), pairs)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("window", "softcap"), [(5, None), (None, 20.0), (3, 5.0)])
def test_windowed_tree_attention_equals_each_path_alone(seed, window, softcap):
    """A sliding window counts depths, not slots: every node of a tree attends as the last token of its own root
    path does alone, under the same window and soft cap (Mistral's and Gemma's layers in a prefix tree)."""
    from forge.model.attention import CausalAttention

    rng = random.Random(seed)
    parents = session_tree(rng, 90) if seed % 2 else random_tree(rng, 90, chain=0.7)
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    generator = torch.Generator().manual_seed(seed)
    size = len(parents)
    q = torch.randn(1, 4, size, 8, generator=generator, requires_grad=True)
    k = torch.randn(1, 2, size, 8, generator=generator, requires_grad=True)
    v = torch.randn(1, 2, size, 8, generator=generator, requires_grad=True)
    rows = []
    for node in range(size):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path = torch.tensor(path[::-1])
        alone = CausalAttention().attend_windowed(0, q[:, :, path], k[:, :, path], v[:, :, path], 0.3, window,
                                                  softcap)
        rows.append(alone[:, :, -1:])
    expected = torch.cat(rows, dim=2)
    weights = torch.randn(expected.shape, generator=generator)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    end, depth = tree_end(parents), torch.tensor(depths)
    for impl in ("dense", "segments"):
        out = TreeAttention(end, impl=impl, depth=depth).attend_windowed(0, q, k, v, 0.3, window, softcap)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
        for grad, ref in zip(torch.autograd.grad((out * weights).sum(), (q, k, v)), expected_grads, strict=True):
            torch.testing.assert_close(grad, ref, atol=1e-5, rtol=1e-5)
    with torch.no_grad():     # no flex backward on CPU: eager flex checks the mask_mod and the score modifier
        flexed = TreeAttention(end, impl="flex", compile_flex=False, depth=depth)
        torch.testing.assert_close(flexed.attend_windowed(0, q, k, v, 0.3, window, softcap), expected, atol=1e-5,
                                   rtol=0)


def test_a_windowed_tree_layer_needs_depths():
    end = tree_end([-1, 0, 1])
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="depths"):
        TreeAttention(end, impl="dense").attend_windowed(0, q, q, q, 1.0, window=2)
