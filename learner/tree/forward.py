"""The learner's forward pass over a packed tree: the tree counterpart of ``forge.learner.policy.policy_forward``.

One pass of the model over the tree's nodes gives the hidden state of every node; each term (a completion token of
one sample) is read at the node of the token before it, under that sample's own sampling transform. The MTP draft
runs over edges: the slot of node c holds the edge parent(c) → c (hidden state of the parent, embedding of c,
position depth(c) − 1) and attends to the edges on c's root path, which is exactly the linear MTP sequence of every
sample through c. A term whose predicting node has depth >= 1 gets the draft's KL at that node toward the main head
there.

A tree batch reads far more terms per token than a linear micro-batch (its prompts are shared), so the output head
runs over row chunks of at most ``head_chunk`` logits, each under activation checkpointing: only one chunk's
[rows, vocab] tensors are alive at a time.

A tree that borrows slots from the step's stem runs the model over its own slots only; the borrowed slots' keys,
values, hidden states and drafts are read from the stem's ``StemState``, so its terms are read exactly as if the
tree had computed them.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from forge.learner.expert_replay import routing_for
from forge.learner.losses import mtp_topk_kl
from forge.learner.policy import PolicyOutput
from forge.learner.tree.packing import TreeBatch, mtp_edges
from forge.learner.tree.stem import StemState
from forge.model.qwen3 import CausalLM
from forge.sampling.logit_edits import LogitEdits
from forge.sampling.sampling import batched_sampling_logprobs


def _read(model: CausalLM, hidden: Tensor, draft: Tensor | None, select: Tensor | None, temperature: Tensor,
          top_k: Tensor, top_p: Tensor, rows: Tensor, targets: Tensor, mtp_top_k: int,
          truncates: tuple[bool, bool] | None = None, edits: LogitEdits | None = None) -> tuple[Tensor, Tensor]:
    """Log-probs of ``targets`` read from sampling rows ``rows`` of the nodes ``hidden``, and the draft's KL at each
    node (empty without ``draft``)."""
    logits = model.logits(hidden)
    sampled = logits if select is None else logits[select]
    logprobs = batched_sampling_logprobs(sampled, temperature, top_k, top_p, truncates, edits)
    token_logprobs = logprobs[rows, targets]
    if draft is None:
        return token_logprobs, logits.new_zeros(0)
    return token_logprobs, mtp_topk_kl(logits, model.mtp_logits(draft, detach_head=True), mtp_top_k)


def all_slots(batch: TreeBatch, computed: Tensor, stem: Tensor | None) -> Tensor:
    """Rows per slot: the computed ones, and the borrowed ones from the stem's rows."""
    if batch.borrowed is None:
        return computed
    assert stem is not None
    return torch.cat([computed, stem[batch.borrowed.stem_rows]]).index_select(0, batch.borrowed.order)


def tree_policy_forward(model: CausalLM, batch: TreeBatch, mtp_top_k: int = 0, impl: str = "auto",
                        block_size: int = 256, head_chunk: int = 2**26,
                        stem: StemState | None = None, routing_mode: str = "replay",
                        keep_router_logits: bool = False) -> PolicyOutput:
    """``logprobs`` [N] and ``mtp_kl`` [M] in the order of ``batch``'s terms (``batch.mtp_terms`` for the draft),
    equal to ``policy_forward(model, make_micro_batch(batch.samples), mtp_top_k)``. A batch that borrows from the
    step's stem needs its ``stem_forward`` state. A model with experts routes as ``routing_mode`` says."""
    if batch.borrowed is not None and stem is None:
        raise ValueError("this tree borrows slots from the step's stem: pass stem=stem_forward(model, step.stem)")
    use_mtp = mtp_top_k > 0 and len(model.mtp) > 0
    if batch.borrowed is not None and use_mtp and stem.draft is None:
        raise ValueError("the stem ran without the MTP layer: run stem_forward with the same mtp_top_k")
    keys = None if stem is None else stem.keys
    routing = routing_for(model, batch.routing, routing_mode, keep_router_logits)
    own = model(batch.input_ids, batch.position_ids, batch.attention(impl, block_size, keys), routing)[0]
    hidden = all_slots(batch, own, None if stem is None else stem.hidden)
    draft = None
    if use_mtp:
        slots = (torch.arange(batch.num_nodes, device=own.device) if batch.borrowed is None
                 else batch.borrowed.computed)
        source, positions = mtp_edges(batch.parent, slots, batch.position_ids)
        attention = batch.mtp_attention(impl, block_size, None if stem is None else stem.mtp_keys)
        own_draft = model.mtp_forward(hidden[source].unsqueeze(0), batch.input_ids, position_ids=positions,
                                      attention=attention, detach_trunk=True)[0]
        draft = all_slots(batch, own_draft, None if stem is None else stem.draft)
    pieces, kls = read_terms(model, batch, hidden, draft, mtp_top_k, head_chunk, 0, batch.logit_nodes.numel())
    order = torch.argsort(batch.term_sampling_row, stable=True)
    token_logprobs = pieces.index_select(0, torch.argsort(order))
    mtp_kl = None if draft is None else kls[batch.term_logit_row[batch.mtp_terms]]
    return PolicyOutput(token_logprobs, mtp_kl, routing)


def read_terms(model: CausalLM, batch: TreeBatch, hidden: Tensor, draft: Tensor | None, mtp_top_k: int,
               head_chunk: int, first: int, last: int) -> tuple[Tensor, Tensor]:
    """The log-probs of the terms read at logit nodes [first, last) (in the batch's terms sorted by sampling row,
    which keeps them contiguous) and the draft's KL at those nodes, from every slot's ``hidden`` and ``draft``. The
    output head runs over chunks of at most ``head_chunk`` logits, each under activation checkpointing."""
    nodes = batch.logit_nodes
    identity = batch.sampling_rows.numel() == nodes.numel()     # one sampling setting per node: no row gather
    order = torch.argsort(batch.term_sampling_row, stable=True)
    sorted_rows = batch.term_sampling_row[order]
    sorted_targets = batch.targets[order]
    step = max(1, head_chunk // model.config.vocab_size)
    bounds = [*range(first, max(last, first + 1), step), last]     # one (empty) chunk keeps the graph without terms
    chunked = len(bounds) > 2 and torch.is_grad_enabled()
    pieces, kls = [], []
    for lo, hi in itertools.pairwise(bounds):
        # Chunk bounds from host offsets built with the batch: no read-back from the device to find them.
        r_lo, r_hi = int(batch.row_first[lo]), int(batch.row_first[hi])
        t_lo, t_hi = int(batch.term_first[r_lo]), int(batch.term_first[r_hi])
        arguments = (model, hidden[nodes[lo:hi]], None if draft is None else draft[nodes[lo:hi]],
                     None if identity else batch.sampling_rows[r_lo:r_hi] - lo, batch.row_temperature[r_lo:r_hi],
                     batch.row_top_k[r_lo:r_hi], batch.row_top_p[r_lo:r_hi], sorted_rows[t_lo:t_hi] - r_lo,
                     sorted_targets[t_lo:t_hi], mtp_top_k, batch.truncates,
                     None if batch.edits is None else batch.edits.select(r_lo, r_hi))
        token_logprobs, kl = checkpoint(_read, *arguments, use_reentrant=False) if chunked else _read(*arguments)
        pieces.append(token_logprobs)
        kls.append(kl)
    return torch.cat(pieces), torch.cat(kls)
