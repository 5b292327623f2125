"""Prefix-tree merging: train the shared prefixes of a batch's samples once, with loss and gradients equal to
sample-by-sample training (see docs/tree.md)."""

from forge.learner.tree.attention import BorrowedKeys, TreeAttention
from forge.learner.tree.forward import tree_policy_forward
from forge.learner.tree.packing import (
    Borrowed,
    Stem,
    TreeBatch,
    TreeStep,
    make_stem,
    make_tree_batch,
    pack_step,
    pack_trees,
    plan_runs,
    rank_spans,
    shared_context,
)
from forge.learner.tree.sharded import sharded_tree_forward
from forge.learner.tree.stem import StemState, stem_forward
from forge.learner.tree.trie import Trie, build_trie

__all__ = [
    "Borrowed",
    "BorrowedKeys",
    "Stem",
    "StemState",
    "TreeAttention",
    "TreeBatch",
    "TreeStep",
    "Trie",
    "build_trie",
    "make_stem",
    "make_tree_batch",
    "pack_step",
    "pack_trees",
    "plan_runs",
    "rank_spans",
    "sharded_tree_forward",
    "shared_context",
    "stem_forward",
    "tree_policy_forward",
]
