"""The token trie of a batch: every distinct token prefix of the samples is one node, numbered in depth-first
(pre-order) order, and every sample is a root-to-node path.

Sorting the sequences lexicographically (a prefix before its extensions) and appending, for each one, the tokens
past its longest common prefix with the previous one yields the nodes directly in pre-order: no pointer structure
is walked, and the cost is linear in the number of sample tokens (comparisons run in numpy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Trie:
    tokens: np.ndarray          # [N] token of each node, pre-order
    parent: np.ndarray          # [N] parent node (-1 for a root); parents precede their children
    depth: np.ndarray           # [N] depth = position id (0 for a root)
    end: np.ndarray             # [N] one past the last node of the subtree: the subtree of n is [n, end[n])
    order: np.ndarray           # [S] sample indices in lexicographic order
    lcp: np.ndarray             # [S] common prefix of the sorted sample with the previous sorted one (0 first)
    start: np.ndarray           # [S + 1] first node created by each sorted sample (start[S] = N)
    paths: list[np.ndarray]     # per sample (input order): the node of each of its tokens

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.size)

    @property
    def num_sample_tokens(self) -> int:
        return int(sum(p.size for p in self.paths))

    @property
    def compression(self) -> float:
        """Total sample tokens / trie tokens: the limit of the speed-up from merging."""
        return self.num_sample_tokens / max(1, self.num_nodes)

    def multiplicity(self) -> np.ndarray:
        """[N] number of samples whose path goes through each node."""
        if not self.paths:
            return np.zeros(0, dtype=np.int64)
        return np.bincount(np.concatenate(self.paths), minlength=self.num_nodes)

    def samples_through(self, node: int) -> list[int]:
        """Indices of the samples whose path contains ``node``."""
        depth = int(self.depth[node])
        return [i for i, path in enumerate(self.paths) if path.size > depth and path[depth] == node]


def _as_array(tokens: Sequence[int]) -> np.ndarray:
    array = np.asarray(tokens, dtype=np.int64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError("every sequence must be a non-empty list of token ids")
    if array.min() < 0 or array.max() >= 2**32:
        raise ValueError("token ids must be in [0, 2**32)")
    return array


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _subtree_ends(lcp: np.ndarray, lengths: np.ndarray, start: np.ndarray) -> np.ndarray:
    """end[n] for every node. A node created by sorted sample i at depth d ends where the first later sample j
    with lcp[j] <= d starts its run (the first sample that leaves the node's subtree)."""
    total = int(start[-1])
    end = np.empty(total, dtype=np.int64)
    # Candidates j > i whose lcp is below every candidate's before them: lcp strictly decreasing with j.
    stack_lcp: list[int] = []
    stack_start: list[int] = []
    for i in range(lcp.size - 1, -1, -1):
        if i + 1 < lcp.size:
            while stack_lcp and stack_lcp[-1] >= lcp[i + 1]:
                stack_lcp.pop()
                stack_start.pop()
            stack_lcp.append(int(lcp[i + 1]))
            stack_start.append(int(start[i + 1]))
        first, last = int(start[i]), int(start[i + 1])
        if first == last:
            continue
        depths = np.arange(int(lcp[i]), int(lengths[i]))
        # The stack read from its top (nearest j) has increasing lcp toward the top; find the nearest j with
        # lcp[j] <= d: scanning from the top, the first entry whose lcp <= d.
        lcps = np.asarray(stack_lcp[::-1], dtype=np.int64)          # nearest first: decreasing
        starts = np.asarray(stack_start[::-1], dtype=np.int64)
        if lcps.size == 0:
            end[first:last] = total
            continue
        # Position of the first entry with lcp <= d in a decreasing array: count of entries with lcp > d.
        position = np.searchsorted(-lcps, -depths, side="left")
        end[first:last] = np.where(position < lcps.size, starts[np.minimum(position, lcps.size - 1)], total)
    return end


def build_trie(sequences: Sequence[Sequence[int]]) -> Trie:
    """The trie of ``sequences`` (token id lists); samples merge wherever their token prefixes agree."""
    arrays = [_as_array(s) for s in sequences]
    keys = [a.astype(">u4").tobytes() for a in arrays]
    order = np.asarray(sorted(range(len(arrays)), key=keys.__getitem__), dtype=np.int64)
    count = len(arrays)
    lcp = np.zeros(count, dtype=np.int64)
    lengths = np.asarray([arrays[i].size for i in order], dtype=np.int64)
    start = np.zeros(count + 1, dtype=np.int64)
    paths: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * count
    pieces_tokens, pieces_parent, pieces_depth = [], [], []
    previous: np.ndarray | None = None
    previous_path = np.empty(0, dtype=np.int64)
    next_node = 0
    for rank, index in enumerate(order):
        array = arrays[index]
        shared = 0 if previous is None else _common_prefix(previous, array)
        lcp[rank] = shared
        start[rank] = next_node
        fresh = array.size - shared
        nodes = np.arange(next_node, next_node + fresh, dtype=np.int64)
        if fresh:
            parents = np.empty(fresh, dtype=np.int64)
            parents[0] = previous_path[shared - 1] if shared else -1
            parents[1:] = nodes[:-1]
            pieces_tokens.append(array[shared:])
            pieces_parent.append(parents)
            pieces_depth.append(np.arange(shared, array.size, dtype=np.int64))
        path = np.concatenate([previous_path[:shared], nodes])
        paths[index] = path
        previous, previous_path = array, path
        next_node += fresh
    start[count] = next_node

    def joined(pieces: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)

    end = _subtree_ends(lcp, lengths, start)
    return Trie(joined(pieces_tokens), joined(pieces_parent), joined(pieces_depth), end, order, lcp, start, paths)
