"""The learner's forward pass over a packed tree: the tree counterpart of ``forge.learner.policy.policy_forward``.

One pass of the model over the tree's nodes gives the logits of every node; each term (a completion token of one
sample) is read at the node of the token before it, under that sample's own sampling transform. The MTP draft runs
over edges: the slot of node c holds the edge parent(c) → c (hidden state of the parent, embedding of c, position
depth(c) − 1) and attends to the edges on c's root path, which is exactly the linear MTP sequence of every sample
through c. A term whose predicting node has depth >= 1 gets the draft's KL at that node toward the main head there.
"""

from __future__ import annotations

import torch

from forge.learner.losses import mtp_topk_kl
from forge.learner.policy import PolicyOutput
from forge.learner.tree.packing import TreeBatch
from forge.model.qwen3 import CausalLM
from forge.model.sampling import batched_sampling_logprobs


def tree_policy_forward(model: CausalLM, batch: TreeBatch, mtp_top_k: int = 0, impl: str = "auto",
                        block_size: int = 256) -> PolicyOutput:
    """``logprobs`` [N] and ``mtp_kl`` [M] in the order of ``batch``'s terms (``batch.mtp_terms`` for the draft),
    equal to ``policy_forward(model, make_micro_batch(batch.samples), mtp_top_k)``."""
    hidden = model(batch.input_ids, batch.position_ids, batch.attention(impl, block_size))
    logits = model.logits(hidden[0, batch.logit_nodes])
    logprobs = batched_sampling_logprobs(logits[batch.sampling_rows], batch.row_temperature, batch.row_top_k,
                                         batch.row_top_p)
    token_logprobs = logprobs[batch.term_sampling_row, batch.targets]
    mtp_kl = None
    if mtp_top_k > 0 and len(model.mtp):
        slots = torch.arange(batch.num_nodes, device=hidden.device)
        source = torch.where(batch.parent >= 0, batch.parent, slots)
        positions = (batch.position_ids - 1).clamp(min=0)
        draft_hidden = model.mtp_forward(hidden[:, source], batch.input_ids, position_ids=positions,
                                         attention=batch.mtp_attention(impl, block_size), detach_trunk=True)
        rows = batch.term_logit_row[batch.mtp_terms]
        used, inverse = torch.unique(rows, return_inverse=True)
        draft_logits = model.mtp_logits(draft_hidden[0, batch.logit_nodes[used]], detach_head=True)
        mtp_kl = mtp_topk_kl(logits[used], draft_logits, mtp_top_k)[inverse]
    return PolicyOutput(token_logprobs, mtp_kl)
