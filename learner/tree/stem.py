"""The step's stem: the context several packed trees of a step share, computed once.

Cut under a token budget, a step's trie becomes several sequences, and each would recompute the context it shares
with the others (the system prompt at least). Instead ``stem_forward`` runs that context once and hands the trees
what they read from it, as leaves: every layer's keys and values (main and MTP), the hidden states and the MTP
draft. The trees' backward passes accumulate gradients into those leaves; ``StemState.backward`` then runs the
stem's forward again, with its graph, and sends the sums through it, once. Every parameter gradient is therefore
the sum over the trees of what each tree's terms give, exactly as if each tree had recomputed the stem.

The second forward (as in activation checkpointing) keeps only the stem's keys, values and hidden states alive
during the step, not its activations, and makes the stem's forward and backward one adjacent pair, as FSDP2 expects
(a graph held across other passes would meet parameters FSDP has resharded since).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from forge.learner.expert_replay import routing_for
from forge.learner.tree.packing import Stem, mtp_edges
from forge.model.moe import Routing, load_balancing_loss
from forge.model.qwen3 import CausalLM


def _run(model: CausalLM, stem: Stem, mtp: bool, impl: str, block_size: int,
         routing: Routing | None = None) -> tuple[list[Tensor], list[list[int]]]:
    """hidden, [draft], then every recorded (key, value) of the main layers, then of the MTP layer; and the layer
    numbers recorded, main and MTP."""
    attention = stem.attention(impl, block_size)
    hidden = model(stem.input_ids, stem.position_ids, attention, routing)[0]
    outputs = [hidden]
    recorded = [attention.recorded or {}]
    if mtp:
        rows = torch.arange(stem.num_nodes, device=hidden.device)
        source, positions = mtp_edges(stem.parent, rows, stem.position_ids)
        mtp_attention = stem.mtp_attention(impl, block_size)
        outputs.append(model.mtp_forward(hidden[source].unsqueeze(0), stem.input_ids, position_ids=positions,
                                         attention=mtp_attention, detach_trunk=True)[0])
        recorded.append(mtp_attention.recorded or {})
    for layers in recorded:
        for layer in sorted(layers):
            outputs += layers[layer]
    return outputs, [sorted(layers) for layers in recorded]


@dataclass
class StemState:
    """What the trees of a step read from its stem, as leaves that collect their gradients."""

    hidden: Tensor                                  # [C, H] the trunk's last hidden states
    draft: Tensor | None                            # [C, H] the MTP layer's output (None without MTP)
    keys: dict[int, tuple[Tensor, Tensor]]          # per main layer, rotated keys and values [1, Hkv, C, D]
    mtp_keys: dict[int, tuple[Tensor, Tensor]]      # the same for the MTP layer
    model: CausalLM
    stem: Stem
    impl: str
    block_size: int
    routing_mode: str = "replay"
    routing: Routing | None = None          # how the first pass routed (a model with experts)
    balance_weight: float = 0.0             # the load-balancing loss's weight on the stem's tokens

    @property
    def leaves(self) -> list[Tensor]:
        """In the order of ``_run``'s outputs."""
        leaves = [self.hidden] + ([self.draft] if self.draft is not None else [])
        for layers in (self.keys, self.mtp_keys):
            for layer in sorted(layers):
                leaves += layers[layer]
        return leaves

    def backward(self) -> None:
        """Run the stem again with its graph and back-propagate the gradients the trees left on the leaves (zeros
        where none came, so that every rank runs the same collectives)."""
        if not self.hidden.requires_grad:
            return
        leaves = self.leaves
        routing = routing_for(self.model, self.stem.routing, self.routing_mode, self.balance_weight > 0)
        outputs, _ = _run(self.model, self.stem, self.draft is not None, self.impl, self.block_size, routing)
        if len(outputs) != len(leaves):
            raise RuntimeError(f"the stem's second pass gave {len(outputs)} tensors, the first {len(leaves)}")
        grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]
        if routing is not None and routing.logits:
            outputs.append(load_balancing_loss(routing.logits, self.model.config.num_experts_per_tok))
            grads.append(torch.tensor(self.balance_weight, device=outputs[-1].device))
        torch.autograd.backward(outputs, grads)


def stem_forward(model: CausalLM, stem: Stem, mtp_top_k: int = 0, impl: str = "auto",
                 block_size: int = 256, routing_mode: str = "replay", balance_weight: float = 0.0) -> StemState:
    """Run ``stem`` through the model (and the MTP layer with ``mtp_top_k`` > 0) without a graph; the leaves
    require gradients when gradients are enabled. A model with experts routes as ``routing_mode`` says; with
    ``balance_weight`` the backward adds that multiple of the stem tokens' load-balancing loss."""
    train = torch.is_grad_enabled()
    mtp = mtp_top_k > 0 and len(model.mtp) > 0
    routing = routing_for(model, stem.routing, routing_mode, balance_weight > 0)
    with torch.no_grad():
        outputs, (main_layers, *mtp_layers) = _run(model, stem, mtp, impl, block_size, routing)
    leaves = iter([out.requires_grad_(train) for out in outputs])
    hidden = next(leaves)
    draft = next(leaves) if mtp else None
    keys = {layer: (next(leaves), next(leaves)) for layer in main_layers}
    mtp_keys = {layer: (next(leaves), next(leaves)) for layer in (mtp_layers[0] if mtp_layers else [])}
    return StemState(hidden, draft, keys, mtp_keys, model, stem, impl, block_size, routing_mode, routing,
                     balance_weight)
