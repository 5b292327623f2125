"""A ``forward``/``forward_backward`` batch through the learner's prefix-tree packing: the batch's datums merged
into one trie, packed under a token budget (``forge.learner.tree.pack_step``), the context several packed sequences
share computed once in the step's stem, and every target read at the node of the position that predicts it
(``tree_policy_forward``), so each shared prefix is computed once and the log-probabilities and gradients equal a
datum-by-datum pass.

A datum is the learner's sample of its model input followed by its last target (a one-token prompt: every position
of the input predicts a term), whose terms' targets are then replaced by the datum's own ``target_tokens`` (Tinker's
targets need not be the next input token; with [N, K] targets each position's term is repeated K times). Terms come
back in the trees' order; ``index`` maps them to the batch's flattened targets (datum by datum, position-major).

On several ranks (``forge.learner.tinker.ranks``) each rank packs its own share of a batch, and every rank must run
as many passes as the others, since FSDP gathers the base's layers in each: a rank with fewer packed sequences (or
none) runs one-token idle passes whose loss is multiplied by zero, one with a shorter stem (or none) runs the stem's
phantom passes, as the learner's trainer does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge.learner.parallel import Distributed
from forge.learner.samples import Sample
from forge.learner.tree import TreeBatch, build_trie, make_stem, pack_step, stem_forward, tree_policy_forward
from forge.model.policy import Policy


@dataclass
class Terms:
    """A batch's flattened targets, datum by datum: where each datum's start (``offsets``), its K (``widths``)."""

    targets: np.ndarray         # [T] int64
    offsets: np.ndarray         # [D + 1]
    widths: list[int]           # per datum, candidates per position


def flat_terms(targets: Sequence[np.ndarray]) -> Terms:
    flat = [np.asarray(t, dtype=np.int64).reshape(-1) for t in targets]
    offsets = np.concatenate([[0], np.cumsum([f.size for f in flat])]).astype(np.int64)
    widths = [1 if np.ndim(t) == 1 else int(np.shape(t)[1]) for t in targets]
    return Terms(np.concatenate(flat), offsets, widths)


def datum_samples(tokens: Sequence[np.ndarray], terms: Terms) -> list[Sample]:
    samples = []
    for i, ids in enumerate(tokens):
        ids = [int(t) for t in ids]
        last = int(terms.targets[terms.offsets[i + 1] - 1])
        samples.append(Sample(tokens=[*ids, last], prompt_len=1, old_logprobs=[0.0] * len(ids), versions=[],
                              advantage=0.0, temperature=1.0, top_k=0, top_p=1.0, domain="", position=i,
                              session_id="", call_index=0))
    return samples


def term_index(batch: TreeBatch, terms: Terms) -> np.ndarray:
    """For each of ``batch``'s terms (once expanded), its place among the flattened targets."""
    return np.concatenate([np.arange(terms.offsets[s.position], terms.offsets[s.position + 1])
                           for s in batch.samples]).astype(np.int64)


def expand_terms(batch: TreeBatch, counts: np.ndarray, targets: Tensor) -> None:
    """Repeat each of ``batch``'s terms ``counts`` times (in place) and give the terms ``targets``."""
    device = batch.targets.device
    if not (counts == 1).all():
        repeats = torch.as_tensor(counts, device=device)
        for name in ("term_logit_row", "term_sampling_row", "old_logprobs", "advantages", "temperature", "top_k",
                     "top_p", "sample_index"):
            setattr(batch, name, getattr(batch, name).repeat_interleave(repeats))
        rows = batch.term_sampling_row.cpu().numpy()
        batch.term_first = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=batch.sampling_rows.numel()))])
        batch.mtp_terms = batch.mtp_terms.new_zeros(0)
    batch.targets = targets.to(device)


def idle_batch(token_budget: int, device: str | torch.device) -> TreeBatch:
    """A one-token tree whose terms go nowhere: the pass a rank with fewer sequences runs to keep in step."""
    sample = Sample(tokens=[0, 0], prompt_len=1, old_logprobs=[0.0], versions=[], advantage=0.0, temperature=1.0,
                    top_k=0, top_p=1.0, domain="", position=-1, session_id="", call_index=0)
    return pack_step([sample], token_budget, device).batches[0]


def packed_logprobs(model: Policy, tokens: Sequence[np.ndarray], targets: Sequence[np.ndarray], token_budget: int,
                    on_batch: Callable[[Tensor, np.ndarray], Tensor | None], device: str | torch.device = "cpu",
                    distributed: Distributed | None = None) -> np.ndarray:
    """log p of every target (flattened, float32), computed over packed trees. ``on_batch(logprobs, index)`` sees
    each packed sequence's terms (with their graph when gradients are enabled) and may return a loss, which is
    back-propagated at once (the stem's share after the last sequence): the gradient adds up in the parameters'
    ``.grad``. With ``distributed``, every rank calls this (with its own share, possibly none) and runs as many
    passes as the busiest rank."""
    distributed = distributed or Distributed()
    if not tokens:
        out, batches, stem = np.zeros(0, dtype=np.float32), [], None
    else:
        terms = flat_terms(targets)
        step = pack_step(datum_samples(tokens, terms), token_budget, device)
        out, batches, stem = np.zeros(terms.targets.size, dtype=np.float32), step.batches, step.stem
    if distributed.max(int(stem is not None)) and stem is None:        # another rank has a stem: run its passes
        stem = make_stem(build_trie([[0]]), np.zeros(1, dtype=np.int64), device)
    state, most = None, distributed.max(len(batches))          # every rank agrees before any pass
    if stem is not None:
        passes = distributed.max(stem.piece_count(token_budget))
        state = stem_forward(model, stem, piece_tokens=token_budget, passes=passes)
    for batch in batches:
        index = term_index(batch, terms)
        counts = np.concatenate([np.full(len(s.tokens) - 1, terms.widths[s.position]) for s in batch.samples])
        expand_terms(batch, counts, torch.from_numpy(terms.targets[index]))
        logprobs = tree_policy_forward(model, batch, stem=state).logprobs
        out[index] = logprobs.detach().float().cpu().numpy()
        loss = on_batch(logprobs, index)
        if loss is not None and loss.requires_grad:
            loss.backward()
    for _ in range(most - len(batches)):
        logprobs = tree_policy_forward(model, idle_batch(token_budget, device)).logprobs
        if logprobs.requires_grad:
            (logprobs.sum() * 0.0).backward()
    if state is not None and torch.is_grad_enabled():
        state.backward()
    return out
