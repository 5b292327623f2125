"""The step's stem: the context several packed trees of a step share, computed once, whatever its length.

Cut under a token budget, a step's trie becomes several sequences, and each would recompute the context it shares
with the others (the system prompt at least, a long tool transcript at most). Instead ``stem_forward`` runs that
context once and hands the trees what they read from it, as leaves: every layer's keys and values (main and MTP),
the hidden states and the MTP draft. The trees' backward passes accumulate gradients into those leaves;
``StemState.backward`` then runs the stem's forward again, with its graph, and sends the sums through it, once.
Every parameter gradient is therefore the sum over the trees of what each tree's terms give, exactly as if each
tree had recomputed the stem.

A stem longer than the budget runs in pieces of at most the budget (``Stem.pieces``), in pre-order: each piece
borrows its ancestors' keys and values from the pieces before it, as a tree borrows from the stem. The backward
takes the pieces in reverse: a piece's pass sends gradients into the keys and values it borrowed, so that by the
time an earlier piece runs its backward, its leaves hold every later reader's share. The budget bounds the
activations of one pass, never what is shared.

The second forward (as in activation checkpointing) keeps only the stem's keys, values and hidden states alive
during the step, not its activations, and makes each piece's forward and backward one adjacent pair, as FSDP2
expects (a graph held across other passes would meet parameters FSDP has resharded since).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from forge.learner.context_parallel import ContextGroup, ShardKeys, Share, share_of
from forge.learner.expert_replay import routing_for
from forge.learner.tree.packing import Stem, StemPiece
from forge.model.moe import Routing, load_balancing_loss
from forge.model.qwen3 import CausalLM


@dataclass
class StemState:
    """What the trees of a step read from its stem, as leaves that collect their gradients."""

    model: CausalLM
    stem: Stem
    pieces: list[StemPiece]
    impl: str
    block_size: int
    routing_mode: str = "replay"
    balance_weight: float = 0.0             # the load-balancing loss's weight on the stem's tokens
    hidden: Tensor | None = None            # [C, H] the trunk's last hidden states (None until the first pass)
    draft: Tensor | None = None             # [C, H] the MTP layer's output (None without MTP)
    keys: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)       # per main layer, rotated keys and
                                                                                # values [1, Hkv, C, D]
    mtp_keys: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)   # the same for the MTP layer
    routings: list[Routing] = field(default_factory=list)   # how this rank's pieces routed (with experts), each
                                                            # token counted on one rank of a context group
    group: ContextGroup = field(default_factory=ContextGroup)
    phantoms: int = 0                       # passes run after the pieces for symmetry with other ranks (discarded)
    shares: list[Share | None] = field(default_factory=list)    # per piece, this rank's share (None: run whole)

    @property
    def leaves(self) -> list[Tensor]:
        """In the order of ``run``'s outputs."""
        assert self.hidden is not None
        leaves = [self.hidden] + ([self.draft] if self.draft is not None else [])
        for layers in (self.keys, self.mtp_keys):
            for layer in sorted(layers):
                leaves += layers[layer]
        return leaves

    @property
    def computed_rows(self) -> int:
        """The stem's rows this rank runs through the model (all of them without context parallelism)."""
        return sum(piece.stop - piece.start if share is None else share.rows.numel()
                   for piece, share in zip(self.pieces, self.shares, strict=True))

    def routing(self, piece: StemPiece, share: Share | None, keep_logits: bool) -> Routing | None:
        recorded = piece.routing if piece.routing is None or share is None else piece.routing[:, share.rows]
        return routing_for(self.model, recorded, self.routing_mode, keep_logits)

    def trunk(self, piece: StemPiece, routing: Routing | None,
              share: Share | None = None) -> tuple[Tensor, dict[int, tuple[Tensor, Tensor]]]:
        """A piece's pass through the model: its own rows' hidden states and the keys and values they recorded,
        borrowing its ancestors' from the state's (with ``share``: this rank computes that share, and every rank's
        rows are gathered)."""
        if share is None:
            attention = piece.attention(self.impl, self.block_size, self.keys)
            hidden = self.model(piece.input_ids, piece.position_ids, attention, routing)[0]
            return hidden, attention.recorded or {}
        sharded = ShardKeys(self.group, share, piece.borrowed_keys(self.keys), recorded={})
        attention = piece.attention(self.impl, self.block_size, self.keys, sharded=sharded)
        own = self.model(piece.input_ids[:, share.rows], piece.position_ids[:, share.rows], attention, routing)[0]
        return share.gather(own, 0, self.group), sharded.recorded

    def drafted(self, piece: StemPiece,
                share: Share | None = None) -> tuple[Tensor, dict[int, tuple[Tensor, Tensor]]]:
        """A piece's pass through the MTP layer over its edges (the state's hidden states written for it first)."""
        assert self.hidden is not None
        rows = slice(None) if share is None else share.rows
        sharded = None if share is None else ShardKeys(self.group, share, piece.borrowed_keys(self.mtp_keys),
                                                       recorded={})
        attention = piece.attention(self.impl, self.block_size, self.mtp_keys, mtp=True, sharded=sharded)
        # The MTP layer reads the trunk detached: the stem's stored hidden states are what this pass would give it.
        draft = self.model.mtp_forward(self.hidden.detach()[piece.source[rows]].unsqueeze(0),
                                       piece.input_ids[:, rows],
                                       position_ids=(piece.position_ids[:, rows] - 1).clamp(min=0),
                                       attention=attention, detach_trunk=True)[0]
        if share is None:
            return draft, attention.recorded or {}
        return share.gather(draft, 0, self.group), sharded.recorded

    def run(self, piece: StemPiece, routing: Routing | None, share: Share | None = None) -> list[Tensor]:
        """One piece's pass with its graph: its rows of every leaf, in ``leaves`` order."""
        hidden, recorded = self.trunk(piece, routing, share)
        outputs, layers = [hidden], [recorded]
        if self.draft is not None:
            draft, mtp_recorded = self.drafted(piece, share)
            outputs.append(draft)
            layers.append(mtp_recorded)
        for recorded_layers in layers:
            for layer in sorted(recorded_layers):
                outputs += recorded_layers[layer]
        return outputs

    def write(self, piece: StemPiece, routing: Routing | None, mtp: bool, share: Share | None = None) -> None:
        """Run a piece without a graph and write its rows into the state's tensors (sized on the first piece)."""
        total, rows = self.stem.num_nodes, slice(piece.start, piece.stop)
        hidden, recorded = self.trunk(piece, routing, share)
        if self.hidden is None:
            self.hidden = hidden.new_zeros((total, *hidden.shape[1:]))
            self.draft = hidden.new_zeros((total, *hidden.shape[1:])) if mtp else None
        self.hidden[rows] = hidden
        _store(self.keys, recorded, piece, total)
        if self.draft is not None:
            draft, mtp_recorded = self.drafted(piece, share)
            self.draft[rows] = draft
            _store(self.mtp_keys, mtp_recorded, piece, total)

    def backward(self) -> None:
        """Run every piece again with its graph, the last first, and back-propagate the gradients the trees (and
        the later pieces) left on its leaves (zeros where none came, so that every rank runs the same
        collectives). Under context parallelism a leaf's gradient is this rank's readers' share: the gathers of
        a sharded piece sum them over the group; a piece run whole passes them on, and the ranks' parameter
        gradients add up."""
        if self.hidden is None or not self.hidden.requires_grad:
            return
        phantom = self.stem.phantom()
        for _ in range(self.phantoms):
            outputs = self.run(phantom, self.routing(phantom, None, False))
            torch.autograd.backward(outputs, [torch.zeros_like(out) for out in outputs])
        leaves = self.leaves
        for piece, share in zip(reversed(self.pieces), reversed(self.shares), strict=True):
            routing = self.routing(piece, share, self.balance_weight > 0)
            outputs = self.run(piece, routing, share)
            if len(outputs) != len(leaves):
                raise RuntimeError(f"the stem's second pass gave {len(outputs)} tensors, the first {len(leaves)}")
            # Cloned: the backward below adds the earlier rows' gradients into the same tensors.
            grads = [_rows(leaf.grad, piece).clone() if leaf.grad is not None else torch.zeros_like(out)
                     for leaf, out in zip(leaves, outputs, strict=True)]
            if routing is not None and routing.logits:
                outputs.append(load_balancing_loss(routing.logits, self.model.config.num_experts_per_tok))
                computed = piece.stop - piece.start if share is None else share.rows.numel()
                weight = computed / self.stem.num_nodes / (self.group.size if share is None else 1)
                grads.append(torch.tensor(self.balance_weight * weight, device=outputs[-1].device))
            torch.autograd.backward(outputs, grads)


def _rows(tensor: Tensor, piece: StemPiece) -> Tensor:
    """A piece's rows of a stem tensor: hidden states [C, H] or keys [1, Hkv, C, D]."""
    return tensor[piece.start:piece.stop] if tensor.dim() == 2 else tensor[:, :, piece.start:piece.stop]


def _store(into: dict[int, tuple[Tensor, Tensor]], recorded: dict[int, tuple[Tensor, Tensor]], piece: StemPiece,
           total: int) -> None:
    """Write a piece's recorded keys and values into the stem's (each [1, Hkv, total, D], made on first sight)."""
    for layer, pair in recorded.items():
        if layer not in into:
            into[layer] = tuple(t.new_zeros((*t.shape[:2], total, *t.shape[3:])) for t in pair)
        for target, source in zip(into[layer], pair, strict=True):
            _rows(target, piece).copy_(source)


def stem_forward(model: CausalLM, stem: Stem, mtp_top_k: int = 0, impl: str = "auto",
                 block_size: int = 256, routing_mode: str = "replay", balance_weight: float = 0.0,
                 piece_tokens: int = 8192, group: ContextGroup | None = None, passes: int = 0) -> StemState:
    """Run ``stem`` through the model (and the MTP layer with ``mtp_top_k`` > 0) without a graph, in pieces of at
    most ``piece_tokens`` rows; the leaves require gradients when gradients are enabled. A model with experts
    routes as ``routing_mode`` says; with ``balance_weight`` the backward adds that multiple of the stem tokens'
    load-balancing loss (each piece's loss weighted by its share of the stem's tokens). With a context ``group``
    each rank computes its share of every piece of at least two rows per rank (``shard_rows``), the keys and values
    gathered per layer; every rank holds the whole stem's leaves. ``passes``: the most pieces any rank's stem
    needs (every rank must run as many passes, forward and backward: the rest are ``Stem.phantom``)."""
    train = torch.is_grad_enabled()
    mtp = mtp_top_k > 0 and len(model.mtp) > 0
    pieces, group = stem.pieces(piece_tokens), group or ContextGroup()
    shares = [share_of(piece.stop - piece.start, group, piece.input_ids.device)
              if group.enabled and piece.stop - piece.start >= 2 * group.size else None for piece in pieces]
    state = StemState(model, stem, pieces, impl, block_size, routing_mode, balance_weight, group=group,
                      phantoms=max(0, passes - len(pieces)), shares=shares)
    with torch.no_grad():
        for piece, share in zip(state.pieces, shares, strict=True):
            routing = state.routing(piece, share, balance_weight > 0)
            state.write(piece, routing, mtp, share)
            if routing is not None and (share is not None or state.group.index == 0):
                state.routings.append(routing)
        phantom = stem.phantom()
        for _ in range(state.phantoms):
            state.trunk(phantom, state.routing(phantom, None, False))
            if mtp:
                state.drafted(phantom)
    for leaf in state.leaves:
        leaf.requires_grad_(train)
    return state
