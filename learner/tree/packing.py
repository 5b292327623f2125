"""Packing a batch's trie into sequences under a token budget, with each sample's loss terms mapped onto nodes.

Samples are taken in the trie's (lexicographic) order and cut into contiguous runs; a run's sequence holds the
union of its samples' paths, i.e. its own nodes plus the ancestors it shares with earlier runs, duplicated as
context. Every sample therefore lies whole in one sequence, and every loss term is read exactly once (from the
sequence of its sample); a node duplicated as context carries gradient only for the terms read there, so the
summed gradient equals the sample-by-sample one. A single sample longer than the budget gets a sequence of its
own, as in ``micro_batches``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge.learner.samples import Sample
from forge.learner.tree.attention import TreeAttention
from forge.learner.tree.trie import Trie, build_trie


@dataclass
class TreeBatch:
    """One packed tree and, per completion token of its samples (in ``make_micro_batch(samples)`` order), what the
    losses need. A term is read at the node whose logits predict it (the node of the token before it)."""

    input_ids: Tensor           # [1, T] node tokens in pre-order
    position_ids: Tensor        # [1, T] node depths
    parent: Tensor              # [T] parent node (-1 for a root)
    end: Tensor                 # [T] subtree end: node j is an ancestor-or-self of i iff j <= i < end[j]
    logit_nodes: Tensor         # [U] distinct nodes whose logits some term reads
    sampling_rows: Tensor       # [R] row of ``logit_nodes`` of each distinct (node, sampling parameters)
    row_temperature: Tensor     # [R]
    row_top_k: Tensor           # [R]
    row_top_p: Tensor           # [R]
    term_logit_row: Tensor      # [N] row of ``logit_nodes`` predicting each term
    term_sampling_row: Tensor   # [N] row of ``sampling_rows`` each term is read from
    targets: Tensor             # [N] the token
    old_logprobs: Tensor        # [N]
    advantages: Tensor          # [N]
    temperature: Tensor         # [N]
    top_k: Tensor               # [N]
    top_p: Tensor               # [N]
    sample_index: Tensor        # [N] index of the sample within this batch
    mtp_terms: Tensor           # [M] terms with a previous token (predicting node at depth >= 1)
    row_first: np.ndarray       # [U + 1] host: first row of ``sampling_rows`` of each logit node (R at U)
    term_first: np.ndarray      # [R + 1] host: first term of each sampling row, terms sorted by row (N at R)
    truncates: tuple[bool, bool]   # host: whether any row samples with top-k, whether any with top-p < 1
    samples: list[Sample]
    num_sample_tokens: int      # tokens of the samples, each counted once per sample

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def num_nodes(self) -> int:
        return int(self.input_ids.shape[1])

    def attention(self, impl: str = "auto", block_size: int = 256) -> TreeAttention:
        """The main model's attention: ancestors and self."""
        return TreeAttention(self.end, impl=impl, block_size=block_size)

    def mtp_attention(self, impl: str = "auto", block_size: int = 256) -> TreeAttention:
        """The MTP layer's attention over edges (parent → node, stored at the node): the edges on the node's root
        path, so root slots (no edge) are seen by nobody but themselves."""
        return TreeAttention(self.end, key_ok=self.position_ids[0] > 0, impl=impl, block_size=block_size)


def plan_runs(trie: Trie, token_budget: int, span: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """Contiguous ranges [a, b) of sorted samples (within ``span``, default all) whose union of paths stays within
    ``token_budget`` nodes (a sample longer than the budget alone), cut where the duplicated context is smallest:
    the fewest packed tokens in all, then the fewest sequences (dynamic programming over the cut points)."""
    lo, hi = span or (0, trie.order.size)
    start, lcp = trie.start, trie.lcp           # start[b] - start[a]: nodes created by sorted samples [a, b)
    best: list[tuple[int, int]] = [(0, 0)] * (hi + 1)
    cut = [lo] * (hi + 1)
    for stop in range(lo + 1, hi + 1):
        choice, where = None, stop - 1
        for first in range(stop - 1, lo - 1, -1):
            created = int(start[stop] - start[first])
            if first < stop - 1 and created > token_budget:
                break
            size = int(lcp[first]) + created
            if first < stop - 1 and size > token_budget:
                continue
            candidate = (best[first][0] + int(lcp[first]), best[first][1] + 1)
            if choice is None or candidate < choice:
                choice, where = candidate, first
        best[stop], cut[stop] = choice, where
    runs, stop = [], hi
    while stop > lo:
        runs.append((cut[stop], stop))
        stop = cut[stop]
    return runs[::-1]


def _run_nodes(trie: Trie, first: int, last: int) -> np.ndarray:
    """Global nodes of the runs' sequence, increasing: the first sample's shared prefix, then the created nodes."""
    shared = trie.paths[trie.order[first]][: int(trie.lcp[first])]
    return np.concatenate([shared, np.arange(trie.start[first], trie.start[last], dtype=np.int64)])


def _local(nodes: np.ndarray, global_ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(nodes, global_ids)


def _offsets(groups: np.ndarray, count: int) -> np.ndarray:
    """[count + 1] first position of each group value in ``groups`` sorted (a searchsorted of 0..count)."""
    return np.concatenate([[0], np.cumsum(np.bincount(groups, minlength=count))]).astype(np.int64)


def make_tree_batch(trie: Trie, samples: Sequence[Sample], first: int, last: int,
                    device: torch.device | str = "cpu") -> TreeBatch:
    nodes = _run_nodes(trie, first, last)
    parent = trie.parent[nodes]
    local_parent = np.where(parent >= 0, _local(nodes, np.maximum(parent, 0)), -1)
    local_end = _local(nodes, trie.end[nodes])
    members = [int(i) for i in trie.order[first:last]]
    batch_samples = [samples[i] for i in members]
    settings: dict[tuple[float, int, float], int] = {}
    term_nodes, term_setting, targets, old, adv, index = ([] for _ in range(6))
    for row, i in enumerate(members):
        sample = samples[i]
        count = sample.num_completion
        if count <= 0:
            continue
        if len(sample.old_logprobs) != count:
            raise ValueError(f"sample {i} has {len(sample.old_logprobs)} behaviour log-probs for {count} tokens")
        setting = settings.setdefault((sample.temperature, sample.top_k, sample.top_p), len(settings))
        term_nodes.append(trie.paths[i][sample.prompt_len - 1: len(sample.tokens) - 1])
        term_setting.append(np.full(count, setting, dtype=np.int64))
        targets += sample.tokens[sample.prompt_len:]
        old += sample.old_logprobs
        adv += [sample.advantage] * count
        index += [row] * count
    empty = np.zeros(0, dtype=np.int64)
    term_local = _local(nodes, np.concatenate(term_nodes) if term_nodes else empty)
    term_setting_a = np.concatenate(term_setting) if term_setting else empty
    logit_nodes, term_logit_row = np.unique(term_local, return_inverse=True)
    # Terms read at the same node under the same sampling parameters share one row of log-probabilities.
    keys, term_sampling_row = np.unique(term_logit_row * max(1, len(settings)) + term_setting_a,
                                        return_inverse=True)
    sampling_rows = keys // max(1, len(settings))
    table = np.asarray(list(settings), dtype=np.float64).reshape(-1, 3)
    row_setting = table[keys % max(1, len(settings))]
    term_params = table[term_setting_a]
    depth = trie.depth[nodes]

    def tensor(values, dtype=torch.long) -> Tensor:
        return torch.as_tensor(np.asarray(values), dtype=dtype).to(device)

    return TreeBatch(
        input_ids=tensor(trie.tokens[nodes]).unsqueeze(0), position_ids=tensor(depth).unsqueeze(0),
        parent=tensor(local_parent), end=tensor(local_end), logit_nodes=tensor(logit_nodes),
        sampling_rows=tensor(sampling_rows), row_temperature=tensor(row_setting[:, 0], torch.float32),
        row_top_k=tensor(row_setting[:, 1]), row_top_p=tensor(row_setting[:, 2], torch.float32),
        term_logit_row=tensor(term_logit_row), term_sampling_row=tensor(term_sampling_row),
        targets=tensor(targets), old_logprobs=tensor(old, torch.float32), advantages=tensor(adv, torch.float32),
        temperature=tensor(term_params[:, 0], torch.float32), top_k=tensor(term_params[:, 1]),
        top_p=tensor(term_params[:, 2], torch.float32), sample_index=tensor(index),
        mtp_terms=tensor(np.flatnonzero(depth[term_local] >= 1)),
        row_first=_offsets(sampling_rows, logit_nodes.size), term_first=_offsets(term_sampling_row, keys.size),
        truncates=(bool((row_setting[:, 1] > 0).any()), bool((row_setting[:, 2] < 1.0).any())), samples=batch_samples,
        num_sample_tokens=sum(len(s.tokens) for s in batch_samples))


def pack_trees(samples: Sequence[Sample], token_budget: int, device: torch.device | str = "cpu",
               trie: Trie | None = None, span: tuple[int, int] | None = None) -> list[TreeBatch]:
    """The batches of one training step: ``samples`` merged into one trie (``trie`` if given, built from all of
    ``samples``), packed under ``token_budget`` nodes per sequence (the tree counterpart of ``micro_batches`` +
    ``make_micro_batch``). ``span``: only the sorted samples [a, b) of the trie (one rank's share, see
    ``rank_spans``)."""
    for sample in samples:
        if sample.prompt_len < 1:
            raise ValueError("every sample needs a prompt of at least one token")
    if token_budget < 1:
        raise ValueError("token_budget must be positive")
    if trie is None:
        trie = build_trie([s.tokens for s in samples])
    return [make_tree_batch(trie, samples, a, b, device) for a, b in plan_runs(trie, token_budget, span)]


def rank_spans(trie: Trie, world_size: int) -> list[tuple[int, int]]:
    """Per rank, a contiguous range [a, b) of the trie's sorted samples, so samples that share prefixes stay on one
    rank, balanced by the nodes each rank must pack: a sample goes where the middle of the nodes it creates falls
    in the packed order (monotone in the sorted order, hence contiguous)."""
    created = np.diff(trie.start)
    middle = trie.start[1:] - (created + 1) // 2
    ranks = np.minimum(world_size - 1, middle * world_size // max(1, trie.num_nodes))
    bounds = np.searchsorted(ranks, np.arange(world_size + 1)).tolist()
    return list(itertools.pairwise(bounds))

