"""Packing a batch's trie into sequences under a token budget, with each sample's loss terms mapped onto nodes.

Samples are taken in the trie's (lexicographic) order and cut into contiguous runs; a run's sequence holds the
union of its samples' paths, i.e. its own nodes plus the ancestors it shares with earlier runs, duplicated as
context. Every sample therefore lies whole in one sequence, and every loss term is read exactly once (from the
sequence of its sample); a node duplicated as context carries gradient only for the terms read there, so the
summed gradient equals the sample-by-sample one. A single sample longer than the budget gets a sequence of its
own, as in ``micro_batches``.

With ``share`` (``pack_step``), the nodes that several sequences of a step would each recompute (the union of the
duplicated contexts) form the step's ``Stem``: it runs once (in pieces of at most the budget when longer), and every
sequence borrows its keys, values and hidden states from it instead of recomputing them (``forge.learner.tree.stem``),
so the step computes every trie node once, whatever the budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge.learner.context_parallel import ShardKeys
from forge.learner.samples import Sample
from forge.learner.tree.attention import BorrowedKeys, TreeAttention
from forge.learner.tree.trie import Trie, build_trie
from forge.sampling.logit_edits import LogitEdits


@dataclass
class Borrowed:
    """The slots of a packed tree whose nodes belong to the step's stem: not computed in the tree's pass, their
    keys, values and hidden states are the stem's rows ``stem_rows``."""

    computed: Tensor            # [T] slots the tree's pass computes, increasing
    slots: Tensor               # [B] slots taken from the stem, increasing
    stem_rows: Tensor           # [B] the stem row of each borrowed slot
    order: Tensor               # [T + B] per slot, its row in cat(computed rows, borrowed rows)


@dataclass
class Stem:
    """The nodes that several sequences of a step share (the union of their duplicated contexts, hence closed under
    ancestors), in pre-order, run once per step (``forge.learner.tree.stem.stem_forward``)."""

    nodes: np.ndarray           # host [C] trie nodes, increasing
    input_ids: Tensor           # [1, C]
    position_ids: Tensor        # [1, C] depths
    parent: Tensor              # [C] parent row (-1 for a root)
    end: Tensor                 # [C] subtree end within the stem
    routing: Tensor | None = None   # [layers, C, top_k] recorded expert ids of each node (-1: none)

    @property
    def num_nodes(self) -> int:
        return int(self.input_ids.shape[1])

    def piece_count(self, token_budget: int) -> int:
        """How many pieces ``pieces(token_budget)`` cuts."""
        return -(-self.num_nodes // token_budget)

    def phantom(self) -> StemPiece:
        """A pass over the stem's first row alone whose results go nowhere: what a rank whose stem needs fewer
        pieces than another's runs instead, so that every rank runs the same passes (FSDP gathers and reduces the
        parameters in each one)."""
        device = self.input_ids.device
        return StemPiece(start=0, stop=1, input_ids=self.input_ids[:, :1], position_ids=self.position_ids[:, :1],
                         source=torch.zeros(1, dtype=torch.long, device=device),
                         end=torch.ones(1, dtype=torch.long, device=device), depth=self.position_ids[0, :1],
                         borrowed=None)

    def pieces(self, token_budget: int) -> list[StemPiece]:
        """The stem cut into runs of at most ``token_budget`` rows, in order: each piece computes its own rows and
        borrows its ancestors' keys and values from the pieces before it (pre-order: they come earlier)."""
        if token_budget < 1:
            raise ValueError("token_budget must be positive")
        end = self.end.cpu().numpy()
        parent = self.parent.cpu().numpy()
        pieces = []
        for start in range(0, self.num_nodes, token_budget):
            stop = min(start + token_budget, self.num_nodes)
            # A row before ``start`` is an ancestor of a row in [start, stop) iff its subtree holds ``start``.
            ancestors = np.flatnonzero(end[:start] > start)
            rows = np.concatenate([ancestors, np.arange(start, stop, dtype=np.int64)])
            borrowed = None
            if ancestors.size:
                count, own = ancestors.size, stop - start
                borrowed = Borrowed(computed=_tensor(np.arange(count, count + own), self.input_ids.device),
                                    slots=_tensor(np.arange(count), self.input_ids.device),
                                    stem_rows=_tensor(ancestors, self.input_ids.device),
                                    order=_tensor(np.concatenate([np.arange(own, own + count), np.arange(own)]),
                                                  self.input_ids.device))
            own_parent = parent[start:stop]
            pieces.append(StemPiece(
                start=start, stop=stop, input_ids=self.input_ids[:, start:stop],
                position_ids=self.position_ids[:, start:stop],
                source=_tensor(np.where(own_parent >= 0, own_parent, np.arange(start, stop)), self.input_ids.device),
                end=_tensor(_local(rows, end[rows]), self.input_ids.device), depth=self.position_ids[0, rows],
                borrowed=borrowed, routing=None if self.routing is None else self.routing[:, start:stop]))
        return pieces


@dataclass
class StemPiece:
    """Rows [start, stop) of a step's stem, run as one pass: a tree of its own rows preceded by their ancestors in
    earlier rows (borrowed: their keys and values come from the passes before)."""

    start: int
    stop: int
    input_ids: Tensor           # [1, n] tokens of its own rows
    position_ids: Tensor        # [1, n] their depths
    source: Tensor              # [n] stem row whose hidden state the MTP layer takes at each own row (see mtp_edges)
    end: Tensor                 # [L] per slot (ancestors, then own rows), its subtree end among the slots
    depth: Tensor               # [L] per slot, its depth
    borrowed: Borrowed | None   # the ancestor slots, from the stem's rows (None: the first piece)
    routing: Tensor | None = None   # [layers, n, top_k] recorded expert ids of its own rows

    def borrowed_keys(self, keys: dict[int, tuple[Tensor, Tensor]] | None) -> BorrowedKeys | None:
        """Where its ancestor slots find their keys and values: ``keys``, the stem's (per layer [1, Hkv, C, D])."""
        if self.borrowed is None:
            return None
        assert keys is not None
        return BorrowedKeys(keys, self.borrowed.stem_rows, self.borrowed.order)

    def attention(self, impl: str, block_size: int, keys: dict[int, tuple[Tensor, Tensor]] | None,
                  mtp: bool = False, sharded: ShardKeys | None = None) -> TreeAttention:
        """The main model's (or with ``mtp`` the MTP layer's) attention, recording the own rows' keys and values;
        borrowed slots read ``keys``. With ``sharded`` (a share of the own rows; it completes the keys and records
        every rank's) the queries are that share's."""
        own = self.borrowed.computed if self.borrowed is not None else None
        common = {"key_ok": self.depth > 0 if mtp else None, "impl": impl, "block_size": block_size,
                  "depth": self.depth}
        if sharded is not None:
            rows = sharded.share.rows
            return TreeAttention(self.end, queries=rows if own is None else own[rows], borrow=sharded, **common)
        return TreeAttention(self.end, record=True, queries=own, borrow=self.borrowed_keys(keys), **common)


@dataclass
class TreeBatch:
    """One packed tree and, per completion token of its samples (in ``make_micro_batch(samples)`` order), what the
    losses need. A term is read at the node whose logits predict it (the node of the token before it)."""

    input_ids: Tensor           # [1, T] tokens of the computed nodes, in pre-order
    position_ids: Tensor        # [1, T] their depths
    parent: Tensor              # [T] their parent's slot (-1 for a root)
    end: Tensor                 # [L] per slot, its subtree end: slot j is an ancestor-or-self of i iff j <= i < end[j]
    depth: Tensor               # [L] per slot, its depth (L = T + borrowed slots)
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
    borrowed: Borrowed | None = None   # slots taken from the step's stem (None: every slot is computed)
    routing: Tensor | None = None      # [layers, T, top_k] recorded expert ids of the computed nodes (-1: none)
    edits: LogitEdits | None = None     # host: edits of the sampling rows' logits (see forge.sampling.logit_edits)

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def num_nodes(self) -> int:
        """Nodes this tree's pass computes (borrowed slots excluded)."""
        return int(self.input_ids.shape[1])

    def attention(self, impl: str = "auto", block_size: int = 256,
                  stem_keys: dict[int, tuple[Tensor, Tensor]] | None = None) -> TreeAttention:
        """The main model's attention: ancestors and self (borrowed slots' keys from ``stem_keys``)."""
        return TreeAttention(self.end, impl=impl, block_size=block_size, depth=self.depth,
                             **self._borrowing(stem_keys))

    def mtp_attention(self, impl: str = "auto", block_size: int = 256,
                      stem_keys: dict[int, tuple[Tensor, Tensor]] | None = None) -> TreeAttention:
        """The MTP layer's attention over edges (parent → node, stored at the node): the edges on the node's root
        path, so root slots (no edge) are seen by nobody but themselves."""
        return TreeAttention(self.end, key_ok=self.depth > 0, impl=impl, block_size=block_size, depth=self.depth,
                             **self._borrowing(stem_keys))

    def _borrowing(self, stem_keys: dict[int, tuple[Tensor, Tensor]] | None) -> dict:
        if self.borrowed is None:
            return {}
        if stem_keys is None:
            raise ValueError("this tree borrows slots from the step's stem: pass the stem's keys")
        return {"queries": self.borrowed.computed,
                "borrow": BorrowedKeys(stem_keys, self.borrowed.stem_rows, self.borrowed.order)}


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


def shared_context(trie: Trie, runs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Trie nodes that more than one of ``runs`` needs: the union of the contexts the later runs share with earlier
    ones (each a root path, so the union is closed under ancestors), increasing."""
    contexts = [trie.paths[trie.order[first]][: int(trie.lcp[first])] for first, _ in runs[1:]]
    return np.unique(np.concatenate(contexts)) if contexts else np.zeros(0, dtype=np.int64)


def mtp_edges(parent: Tensor, slots: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """The MTP layer's input rows and positions over edges: slot c holds edge parent(c) → c, so it takes its
    parent's hidden state (a root, which has no edge, its own) at position depth(c) − 1."""
    return torch.where(parent >= 0, parent, slots), (position_ids - 1).clamp(min=0)


def _tensor(values, device: torch.device | str, dtype=torch.long) -> Tensor:
    return torch.as_tensor(np.asarray(values), dtype=dtype).to(device)


def node_routing(trie: Trie, nodes: np.ndarray, device: torch.device | str) -> Tensor | None:
    """The recorded routing of ``nodes`` as [layers, nodes, top_k], None for a trie without routing."""
    if trie.routing is None:
        return None
    return torch.from_numpy(np.ascontiguousarray(trie.routing[nodes])).transpose(0, 1).to(device)


def make_stem(trie: Trie, nodes: np.ndarray, device: torch.device | str = "cpu") -> Stem:
    """The stem of ``nodes`` (increasing, closed under ancestors)."""
    parent = trie.parent[nodes]
    return Stem(nodes=nodes, input_ids=_tensor(trie.tokens[nodes], device).unsqueeze(0),
                position_ids=_tensor(trie.depth[nodes], device).unsqueeze(0),
                parent=_tensor(np.where(parent >= 0, _local(nodes, np.maximum(parent, 0)), -1), device),
                end=_tensor(_local(nodes, trie.end[nodes]), device), routing=node_routing(trie, nodes, device))


def _borrowed(nodes: np.ndarray, stem_nodes: np.ndarray,
              device: torch.device | str) -> tuple[Borrowed | None, np.ndarray]:
    """The borrowed slots of a sequence of ``nodes``, and (on the host) the slots it computes."""
    rows = np.minimum(_local(stem_nodes, nodes), max(0, stem_nodes.size - 1))
    taken = (stem_nodes[rows] == nodes) if stem_nodes.size else np.zeros(nodes.size, dtype=bool)
    computed, slots = np.flatnonzero(~taken), np.flatnonzero(taken)
    if not slots.size:
        return None, computed
    order = np.empty(nodes.size, dtype=np.int64)
    order[computed] = np.arange(computed.size)
    order[slots] = computed.size + np.arange(slots.size)
    return Borrowed(computed=_tensor(computed, device), slots=_tensor(slots, device),
                    stem_rows=_tensor(rows[slots], device), order=_tensor(order, device)), computed


def make_tree_batch(trie: Trie, samples: Sequence[Sample], first: int, last: int,
                    device: torch.device | str = "cpu", stem_nodes: np.ndarray | None = None) -> TreeBatch:
    """The packed tree of sorted samples [first, last); slots whose node is in ``stem_nodes`` are borrowed."""
    nodes = _run_nodes(trie, first, last)
    borrowed, computed = (None, np.arange(nodes.size)) if stem_nodes is None else _borrowed(nodes, stem_nodes, device)
    parent = trie.parent[nodes]
    local_parent = np.where(parent >= 0, _local(nodes, np.maximum(parent, 0)), -1)
    local_end = _local(nodes, trie.end[nodes])
    members = [int(i) for i in trie.order[first:last]]
    batch_samples = [samples[i] for i in members]
    # A term's setting: its sampling parameters, and its sample when the actor edited its logits (those rows are its
    # own: no other sample's term shares them).
    settings: dict[tuple[float, int, float, int], int] = {}
    edited: list[tuple[int, LogitEdits]] = []       # (first term, the sample's edits by term)
    term_nodes, term_setting, targets, old, adv, index = ([] for _ in range(6))
    for row, i in enumerate(members):
        sample = samples[i]
        count = sample.num_completion
        if count <= 0:
            continue
        if len(sample.old_logprobs) != count:
            raise ValueError(f"sample {i} has {len(sample.old_logprobs)} behaviour log-probs for {count} tokens")
        owner = -1 if sample.edits is None else i
        setting = settings.setdefault((sample.temperature, sample.top_k, sample.top_p, owner), len(settings))
        if sample.edits is not None:
            edited.append((len(targets), sample.edits))
        term_nodes.append(trie.paths[i][sample.prompt_len - 1: len(sample.tokens) - 1])
        term_setting.append(np.full(count, setting, dtype=np.int64))
        targets += sample.tokens[sample.prompt_len:]
        old += sample.old_logprobs
        adv += sample.completion_advantages()
        index += [row] * count
    empty = np.zeros(0, dtype=np.int64)
    term_local = _local(nodes, np.concatenate(term_nodes) if term_nodes else empty)
    term_setting_a = np.concatenate(term_setting) if term_setting else empty
    logit_nodes, term_logit_row = np.unique(term_local, return_inverse=True)
    # Terms read at the same node under the same sampling parameters share one row of log-probabilities.
    keys, term_sampling_row = np.unique(term_logit_row * max(1, len(settings)) + term_setting_a,
                                        return_inverse=True)
    sampling_rows = keys // max(1, len(settings))
    table = np.asarray([key[:3] for key in settings], dtype=np.float64).reshape(-1, 3)
    row_setting = table[keys % max(1, len(settings))]
    # An edited sample's terms each have a row of their own, in term order: its edits move from terms to rows.
    edits = LogitEdits.concat(e.renumbered(term_sampling_row[first:]) for first, e in edited)
    term_params = table[term_setting_a]
    depth = trie.depth[nodes]

    def tensor(values, dtype=torch.long) -> Tensor:
        return _tensor(values, device, dtype)

    return TreeBatch(
        input_ids=tensor(trie.tokens[nodes[computed]]).unsqueeze(0), position_ids=tensor(depth[computed]).unsqueeze(0),
        parent=tensor(local_parent[computed]), end=tensor(local_end), depth=tensor(depth),
        logit_nodes=tensor(logit_nodes),
        sampling_rows=tensor(sampling_rows), row_temperature=tensor(row_setting[:, 0], torch.float32),
        row_top_k=tensor(row_setting[:, 1]), row_top_p=tensor(row_setting[:, 2], torch.float32),
        term_logit_row=tensor(term_logit_row), term_sampling_row=tensor(term_sampling_row),
        targets=tensor(targets), old_logprobs=tensor(old, torch.float32), advantages=tensor(adv, torch.float32),
        temperature=tensor(term_params[:, 0], torch.float32), top_k=tensor(term_params[:, 1]),
        top_p=tensor(term_params[:, 2], torch.float32), sample_index=tensor(index),
        mtp_terms=tensor(np.flatnonzero(depth[term_local] >= 1)),
        row_first=_offsets(sampling_rows, logit_nodes.size), term_first=_offsets(term_sampling_row, keys.size),
        truncates=(bool((row_setting[:, 1] > 0).any()), bool((row_setting[:, 2] < 1.0).any())), samples=batch_samples,
        num_sample_tokens=sum(len(s.tokens) for s in batch_samples), borrowed=borrowed,
        edits=edits,
        routing=node_routing(trie, nodes[computed], device))


@dataclass
class TreeStep:
    """The packed trees of one training step, and the stem they borrow from (None: nothing shared)."""

    stem: Stem | None
    batches: list[TreeBatch]

    @property
    def num_nodes(self) -> int:
        """Nodes the step computes: the stem's and every tree's own."""
        return (self.stem.num_nodes if self.stem else 0) + sum(b.num_nodes for b in self.batches)


def pack_step(samples: Sequence[Sample], token_budget: int, device: torch.device | str = "cpu",
              trie: Trie | None = None, span: tuple[int, int] | None = None, share: bool = True) -> TreeStep:
    """The packed trees of one training step: ``samples`` merged into one trie (``trie`` if given, built from all of
    ``samples``), packed under ``token_budget`` slots per sequence (the tree counterpart of ``micro_batches`` +
    ``make_micro_batch``). ``span``: only the sorted samples [a, b) of the trie (one rank's share, see
    ``rank_spans``). With ``share``, the context several sequences need is computed once, in the step's stem (run
    in pieces of at most the budget); without, each sequence recomputes it."""
    for sample in samples:
        if sample.prompt_len < 1:
            raise ValueError("every sample needs a prompt of at least one token")
    if token_budget < 1:
        raise ValueError("token_budget must be positive")
    if trie is None:
        trie = build_trie([s.tokens for s in samples], [s.routing for s in samples])
    runs = plan_runs(trie, token_budget, span)
    stem_nodes = shared_context(trie, runs) if share else np.zeros(0, dtype=np.int64)
    if not stem_nodes.size:
        return TreeStep(None, [make_tree_batch(trie, samples, a, b, device) for a, b in runs])
    return TreeStep(make_stem(trie, stem_nodes, device),
                    [make_tree_batch(trie, samples, a, b, device, stem_nodes) for a, b in runs])


def pack_trees(samples: Sequence[Sample], token_budget: int, device: torch.device | str = "cpu",
               trie: Trie | None = None, span: tuple[int, int] | None = None) -> list[TreeBatch]:
    """``pack_step`` without a stem: every sequence recomputes the context it shares with others."""
    return pack_step(samples, token_budget, device, trie, span, share=False).batches


def rank_spans(trie: Trie, world_size: int) -> list[tuple[int, int]]:
    """Per rank, a contiguous range [a, b) of the trie's sorted samples, so samples that share prefixes stay on one
    rank, balanced by the nodes each rank must pack: a sample goes where the middle of the nodes it creates falls
    in the packed order (monotone in the sorted order, hence contiguous)."""
    created = np.diff(trie.start)
    middle = trie.start[1:] - (created + 1) // 2
    ranks = np.minimum(world_size - 1, middle * world_size // max(1, trie.num_nodes))
    bounds = np.searchsorted(ranks, np.arange(world_size + 1)).tolist()
    return list(itertools.pairwise(bounds))

