"""The token trie of a batch: every distinct token prefix of the samples is one node, numbered in depth-first
(pre-order) order, and every sample is a root-to-node path.

For a model with experts, each sample may bring the routing its actor recorded at every position (``routing``): a
node then also holds the routing of its position, for the learner to replay. With ``split_by_routing`` two samples
share a node only where their tokens *and* recorded routings agree (a prefix computed under two weight versions,
routed differently, is trained twice, each as it was routed); without, they merge by tokens alone and a node
keeps the routing of the sample that created it.

Sorting the sequences lexicographically (a prefix before its extensions) and appending, for each one, the tokens
past its longest common prefix with the previous one yields the nodes directly in pre-order: no pointer structure
is walked, and the cost is linear in the number of sample tokens (comparisons run in numpy).
"""

from __future__ import annotations

import itertools
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
    routing: np.ndarray | None = None   # [N, sparse layers, top_k] recorded expert ids per node (-1: none)

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


def _routing_codes(arrays: list[np.ndarray], routing: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray],
                                                                                          np.ndarray]:
    """Per sample, a code per position naming its recorded routing row (positions past the record: a row of -1),
    and the table of rows [codes, layers, top_k]."""
    shape = next(r.shape[1:] for r in routing if r is not None)
    rows = []
    for array, record in zip(arrays, routing, strict=True):
        full = np.full((array.size, *shape), -1, dtype=np.int32)
        if record is not None:
            if record.shape[1:] != shape or len(record) > array.size:
                raise ValueError(f"a routing record of shape {record.shape} does not fit a sample of {array.size} "
                                 f"tokens routed as {shape}")
            full[:len(record)] = record
        rows.append(full)
    flat = np.ascontiguousarray(np.concatenate(rows).reshape(sum(a.size for a in arrays), -1))
    as_void = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()
    _, first, codes = np.unique(as_void, return_index=True, return_inverse=True)
    table = flat[first].reshape(-1, *shape)
    bounds = np.cumsum([0, *(a.size for a in arrays)])
    return [codes[a:b].astype(np.int64) for a, b in itertools.pairwise(bounds.tolist())], table


def build_trie(sequences: Sequence[Sequence[int]], routing: Sequence[np.ndarray | None] | None = None,
               split_by_routing: bool = True) -> Trie:
    """The trie of ``sequences`` (token id lists); samples merge wherever their token prefixes agree (and their
    recorded ``routing``, one [positions, layers, top_k] array or None per sample, with ``split_by_routing``)."""
    arrays = [_as_array(s) for s in sequences]
    if routing is None or all(r is None for r in routing):
        return _build(arrays)
    codes, table = _routing_codes(arrays, routing)
    if split_by_routing:           # the symbol of a position: its routing code, then its token (both < 2**32)
        trie = _build([(c << 32) | a for a, c in zip(arrays, codes, strict=True)])
        trie.routing = table[trie.tokens >> 32]
        trie.tokens = trie.tokens & 0xFFFFFFFF
        return trie
    trie = _build(arrays)
    node_codes = np.empty(trie.num_nodes, dtype=np.int64)
    for rank, index in enumerate(trie.order.tolist()):       # every node is created by one sample: its code
        shared = int(trie.lcp[rank])
        node_codes[trie.paths[index][shared:]] = codes[index][shared:]
    trie.routing = table[node_codes]
    return trie


def _build(arrays: list[np.ndarray]) -> Trie:
    keys = [a.astype(">u8").tobytes() for a in arrays]
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
