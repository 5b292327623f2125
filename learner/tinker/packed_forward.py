"""A ``forward``/``forward_backward`` batch through the learner's prefix-tree packing: the batch's datums merged
into one trie, packed under a token budget (``forge.learner.tree.pack_step``), the context several packed sequences
share computed once in the step's stem, and every target read at the node of the position that predicts it
(``tree_policy_forward``), so each shared prefix is computed once and the log-probabilities and gradients equal a
datum-by-datum pass.

A datum is the learner's sample of its model input followed by its last target (a one-token prompt: every position
of the input predicts a term), whose terms' targets are then replaced by the datum's own ``target_tokens`` (Tinker's
targets need not be the next input token; with [N, K] targets each position's term is repeated K times). Terms come
back in the trees' order; ``index`` maps them to the batch's flattened targets (datum by datum, position-major).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge.learner.samples import Sample
from forge.learner.tree import TreeBatch, pack_step, stem_forward, tree_policy_forward
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


def packed_logprobs(model: Policy, tokens: Sequence[np.ndarray], targets: Sequence[np.ndarray], token_budget: int,
                    on_batch: Callable[[Tensor, np.ndarray], Tensor | None], device: str | torch.device = "cpu"
                    ) -> np.ndarray:
    """log p of every target (flattened, float32), computed over packed trees. ``on_batch(logprobs, index)`` sees
    each packed sequence's terms (with their graph when gradients are enabled) and may return a loss, which is
    back-propagated at once (the stem's share after the last sequence): the gradient adds up in the parameters'
    ``.grad``."""
    terms = flat_terms(targets)
    samples = datum_samples(tokens, terms)
    step = pack_step(samples, token_budget, device)
    state = stem_forward(model, step.stem, piece_tokens=token_budget) if step.stem is not None else None
    out = np.zeros(terms.targets.size, dtype=np.float32)
    for batch in step.batches:
        index = term_index(batch, terms)
        counts = np.concatenate([np.full(len(s.tokens) - 1, terms.widths[s.position]) for s in batch.samples])
        expand_terms(batch, counts, torch.from_numpy(terms.targets[index]))
        logprobs = tree_policy_forward(model, batch, stem=state).logprobs
        out[index] = logprobs.detach().float().cpu().numpy()
        loss = on_batch(logprobs, index)
        if loss is not None and loss.requires_grad:
            loss.backward()
    if state is not None and torch.is_grad_enabled():
        state.backward()
    return out
