"""The forward pass over one packed tree whose tokens are split across a context-parallel group
(``forge.learner.context_parallel``): the sharded counterpart of ``tree_policy_forward``.

Every rank of the group holds the same tree and computes its share of the tree's own slots (zig-zag, see
``shard_rows``) through the model: its queries attend to the keys and values of every slot, gathered from the ranks
that computed them layer by layer (``ShardKeys``; slots borrowed from the step's stem come from the stem, which
every rank of the group holds). The hidden states (and MTP drafts) of the slots are gathered once after the trunk:
the MTP layer reads its parents' from them, and each rank reads the terms of its share of the logit nodes. The
terms' log-probs are then gathered, so every rank returns them all, in the batch's order, as the unsharded pass
does: each computes the same loss from them, and the gather hands every rank the gradient of its own terms.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from forge.learner.context_parallel import ContextGroup, ShardKeys, gather_rows, share_of
from forge.learner.expert_replay import routing_for
from forge.learner.policy import PolicyOutput
from forge.learner.tree.attention import BorrowedKeys, TreeAttention
from forge.learner.tree.forward import all_slots, read_terms, tree_policy_forward
from forge.learner.tree.packing import TreeBatch, mtp_edges
from forge.learner.tree.stem import StemState
from forge.model.qwen3 import CausalLM


def sharded_tree_forward(model: CausalLM, batch: TreeBatch, group: ContextGroup, mtp_top_k: int = 0,
                         impl: str = "auto", block_size: int = 256, head_chunk: int = 2**26,
                         stem: StemState | None = None, routing_mode: str = "replay",
                         keep_router_logits: bool = False) -> PolicyOutput:
    """``tree_policy_forward`` with this rank computing its share of the tree: the same ``logprobs`` and ``mtp_kl``
    (all terms, on every rank of the group); ``routing`` covers this rank's tokens. A tree of fewer than two tokens
    per rank is not split: every rank computes it whole, and each passes back 1 / N of its terms' gradients."""
    if batch.borrowed is not None and stem is None:
        raise ValueError("this tree borrows slots from the step's stem: pass stem=stem_forward(model, step.stem)")
    if batch.num_nodes < 2 * group.size:
        whole = tree_policy_forward(model, batch, mtp_top_k, impl, block_size, head_chunk, stem, routing_mode,
                                    keep_router_logits)
        scale = 1.0 / group.size
        return PolicyOutput(_scaled_grad(whole.logprobs, scale),
                            None if whole.mtp_kl is None else _scaled_grad(whole.mtp_kl, scale), whole.routing)
    use_mtp = mtp_top_k > 0 and len(model.mtp) > 0
    device = batch.input_ids.device
    share = share_of(batch.num_nodes, group, device)
    rows = share.rows
    computed_slots = batch.borrowed.computed if batch.borrowed is not None else torch.arange(batch.num_nodes,
                                                                                             device=device)
    queries = computed_slots[rows]

    def attention(mtp: bool) -> TreeAttention:
        borrowed = None
        if batch.borrowed is not None:
            borrowed = BorrowedKeys(stem.mtp_keys if mtp else stem.keys, batch.borrowed.stem_rows,
                                    batch.borrowed.order)
        return TreeAttention(batch.end, key_ok=batch.depth > 0 if mtp else None, impl=impl, block_size=block_size,
                             depth=batch.depth, queries=queries,
                             borrow=ShardKeys(group, share, borrowed))

    routing = routing_for(model, None if batch.routing is None else batch.routing[:, rows], routing_mode,
                          keep_router_logits)
    input_ids, position_ids = batch.input_ids[:, rows], batch.position_ids[:, rows]
    own = model(input_ids, position_ids, attention(mtp=False), routing)[0]
    hidden = all_slots(batch, share.gather(own, 0, group), None if stem is None else stem.hidden)
    draft = None
    if use_mtp:
        if batch.borrowed is not None and stem.draft is None:
            raise ValueError("the stem ran without the MTP layer: run stem_forward with the same mtp_top_k")
        source, positions = mtp_edges(batch.parent[rows], queries, position_ids)
        own_draft = model.mtp_forward(hidden[source].unsqueeze(0), input_ids, position_ids=positions,
                                      attention=attention(mtp=True), detach_trunk=True)[0]
        draft = all_slots(batch, share.gather(own_draft, 0, group), None if stem is None else stem.draft)

    nodes = batch.logit_nodes.numel()
    bounds = [nodes * i // group.size for i in range(group.size + 1)]
    first, last = bounds[group.index], bounds[group.index + 1]
    pieces, kls = read_terms(model, batch, hidden, draft, mtp_top_k, head_chunk, first, last)
    terms_at = [int(batch.term_first[int(batch.row_first[n])]) for n in bounds]
    sorted_logprobs = gather_rows(pieces, 0, tuple(b - a for a, b in itertools.pairwise(terms_at)),
                                  group, summed=False)
    order = torch.argsort(batch.term_sampling_row, stable=True)
    token_logprobs = sorted_logprobs.index_select(0, torch.argsort(order))
    mtp_kl = None
    if draft is not None:
        node_kls = gather_rows(kls, 0, tuple(b - a for a, b in itertools.pairwise(bounds)), group,
                               summed=False)
        mtp_kl = node_kls[batch.term_logit_row[batch.mtp_terms]]
    return PolicyOutput(token_logprobs, mtp_kl, routing)


def _scaled_grad(values: Tensor, scale: float) -> Tensor:
    """``values``, whose gradient is multiplied by ``scale`` on its way back."""
    return values * scale + (values * (1.0 - scale)).detach()
