"""Prefix-tree merging: train the shared prefixes of a batch's samples once, with loss and gradients equal to
sample-by-sample training (see docs/tree.md)."""

from forge.learner.tree.attention import TreeAttention
from forge.learner.tree.forward import tree_policy_forward
from forge.learner.tree.packing import (
    TreeBatch,
    make_tree_batch,
    pack_trees,
    plan_runs,
    rank_spans,
)
from forge.learner.tree.trie import Trie, build_trie

__all__ = [
           "TreeAttention",
           "TreeBatch",
           "Trie",
           "build_trie",
           "make_tree_batch",
           "pack_trees",
           "plan_runs",
           "rank_spans",
           "tree_policy_forward",
]
