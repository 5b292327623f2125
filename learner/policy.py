"""The learner's forward pass over a micro-batch: log-probabilities of the sampled tokens under the current policy
(with the same temperature and truncation the actor sampled with), and the MTP draft's distillation loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from forge.learner.expert_replay import routing_for
from forge.learner.losses import mtp_topk_kl
from forge.learner.samples import MicroBatch
from forge.model.moe import Routing
from forge.model.policy import Policy
from forge.model.qwen3 import CausalLM
from forge.sampling.sampling import batched_sampling_logprobs


@dataclass
class PolicyOutput:
    logprobs: Tensor                 # [N] log π(token) of every completion token
    mtp_kl: Tensor | None            # [M] per-position draft loss (positions with a previous token)
    routing: Routing | None = None   # a model with experts: how the pass routed (see forge.learner.expert_replay)
    tokens: Tensor | None = None     # the rows of ``routing`` that are tokens (None: all)


def policy_forward(model: Policy, batch: MicroBatch, mtp_top_k: int = 0, routing_mode: str = "replay",
                   keep_router_logits: bool = False) -> PolicyOutput:
    """One forward pass. With ``mtp_top_k`` > 0 and an MTP module, the draft at position q − 1 (hidden state at
    q − 1, embedding of token q) is distilled toward the main head's distribution at q; the draft's loss reaches
    the MTP module only (the trunk, embeddings and output head are detached). A model with experts routes as
    ``routing_mode`` says (``forge.learner.expert_replay``)."""
    routing = routing_for(model, batch.routing, routing_mode, keep_router_logits)
    hidden = model(batch.input_ids, routing=routing)
    picked = hidden[batch.rows, batch.positions]
    logits = model.logits(picked)
    logprobs = batched_sampling_logprobs(logits, batch.temperature, batch.top_k, batch.top_p, edits=batch.edits)
    token_logprobs = logprobs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    mtp_kl = None
    if mtp_top_k > 0 and len(model.mtp) and isinstance(model, CausalLM):      # MTP drafts are CausalLM's alone
        draft_hidden = model.mtp_forward(hidden[:, :-1], batch.input_ids[:, 1:], detach_trunk=True)
        has_previous = batch.positions >= 1
        rows, positions = batch.rows[has_previous], batch.positions[has_previous] - 1
        draft_logits = model.mtp_logits(draft_hidden[rows, positions], detach_head=True)
        mtp_kl = mtp_topk_kl(logits[has_previous], draft_logits, mtp_top_k)
    return PolicyOutput(token_logprobs, mtp_kl, routing, batch.valid)


@torch.no_grad()
def recompute_logprobs(model: Policy, batch: MicroBatch) -> Tensor:
    """log π of the recorded tokens without gradient (the learner-vs-actor agreement check)."""
    return policy_forward(model, batch).logprobs
