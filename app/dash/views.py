"""What the dash shows of a recorded group that the pool does not store: each call's advantage as the learner
computes it (``forge.learner.rewards``, default settings) and the group's prefix tree as the learner packs it
(``forge.learner.tree.build_trie`` over one sample per call: prompt then completion)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from forge.learner.rewards import RewardConfig, group_rewards
from forge.pool import InvalidRequestError
from forge.v1 import pool_pb2

MAX_SEGMENTS = 400          # a tree drawn with more is cut (the totals still count everything)
MAX_TREE_TOKENS = 16_000_000    # a group with more sample tokens than this is not merged for the page
PREVIEW_TOKENS = 24


def advantages(group: list[pool_pb2.SessionWithCalls], config: RewardConfig | None = None
               ) -> dict[str, list[float]]:
    """Per session id, the advantage of each call (every token of a call shares it)."""
    return {r.session_id: r.advantages for r in group_rewards(group, config or RewardConfig())}


def _segments(parent: np.ndarray, multiplicity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment of each node, first node of each segment): a segment is a chain of nodes with one child each and
    the same number of samples through them, drawn as one bar."""
    n = parent.size
    children = np.bincount(parent[parent >= 0], minlength=n)
    continues = np.zeros(n, dtype=bool)
    if n > 1:
        previous = np.arange(n - 1)
        continues[1:] = ((parent[1:] == previous) & (children[previous] == 1)
                         & (multiplicity[1:] == multiplicity[previous]))
    starts = np.flatnonzero(~continues)
    return np.cumsum(~continues) - 1, starts


def prefix_tree(group: list[pool_pb2.SessionWithCalls], decode: Callable[[Sequence[int]], str] | None = None
                ) -> dict[str, Any]:
    """The trie of the group's samples: its totals (tokens over all samples, tokens trained once merged) and its
    segments in depth-first order, each with its parent segment, first depth, tokens, the samples through it and
    the start of its text."""
    from forge.learner.tree import build_trie  # imports torch: only when a tree is asked for

    labels, sequences = [], []
    for item in group:
        for call in sorted(item.calls, key=lambda c: c.index):
            if call.completion_ids:
                labels.append(f"{item.session.session_id}#{call.index}")
                sequences.append([*call.prompt_ids, *call.completion_ids])
    total = sum(len(s) for s in sequences)
    if total > MAX_TREE_TOKENS:
        raise InvalidRequestError(f"the group's {len(sequences)} samples hold {total} tokens, more than the dash "
                                  f"merges ({MAX_TREE_TOKENS})")
    if not sequences:
        return {"samples": [], "sample_tokens": 0, "tree_tokens": 0, "compression": 1.0, "segments": [],
                "truncated": False}
    trie = build_trie(sequences)
    multiplicity = trie.multiplicity()
    segment_of, starts = _segments(trie.parent, multiplicity)
    ends = np.append(starts[1:], trie.num_nodes)
    first_sample = {}
    for sample, path in enumerate(trie.paths):
        for segment in np.unique(segment_of[path]):
            first_sample.setdefault(int(segment), []).append(sample)
    segments = []
    for index, (start, end) in enumerate(zip(starts[:MAX_SEGMENTS], ends[:MAX_SEGMENTS], strict=True)):
        up = int(trie.parent[start])
        tokens = trie.tokens[start:end].tolist()
        segments.append({
            "id": index, "parent": int(segment_of[up]) if up >= 0 else None, "depth": int(trie.depth[start]),
            "tokens": len(tokens), "samples": first_sample.get(index, []), "times": int(multiplicity[start]),
            "text": decode(tokens[:PREVIEW_TOKENS]) if decode is not None else None,
            "ids": tokens[:PREVIEW_TOKENS],
        })
    return {"samples": labels, "sample_tokens": trie.num_sample_tokens, "tree_tokens": trie.num_nodes,
            "compression": trie.compression, "segments": segments, "truncated": len(starts) > MAX_SEGMENTS}
