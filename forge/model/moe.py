"""The sparse mixture-of-experts block of Qwen3-MoE, and the routing hooks that record or replay its choices.

Each token's router logits (a linear map of its hidden state) go through a softmax; the top ``k`` experts are
chosen, their probabilities optionally renormalised to sum to one, and the token's output is the sum of those
experts' SwiGLU outputs weighted by them.

Experts are held as two stacked tensors, ``gate_up_proj`` [E, 2I, H] (each expert's gate rows, then its up rows)
and ``down_proj`` [E, H, I], the layout transformers keeps in memory; checkpoints hold one module per expert
(``forge.model.checkpoint`` converts). The computation is grouped: the (token, expert) pairs are sorted by expert
and every expert's tokens go through one grouped matrix multiply (``torch.nn.functional.grouped_mm``), with no
Python loop over tokens or experts (a loop over experts remains only where grouped_mm does not serve the device
and dtype). Under ``torch.compile`` (the engine's graph mode) the grouped multiply is one opaque op,
``forge::grouped_linear``: torch's own shape function for grouped_mm accepts CUDA's dtypes only, and where the
loop over experts remains it runs inside the op, outside the graph.

Routing is per token, so a token routes the same whatever else is in its batch, up to the rounding of its router
logits. Training must still route exactly as the rollout did (other kernels, batch shapes and weight versions move
near-ties): a ``Routing`` passed to the forward records every sparse layer's choices, or replays given ones. A
replayed token keeps the recorded experts and takes its weights from the current router's probabilities at them,
so the router still learns.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from forge.model.config import ModelConfig


class Routing:
    """The routing of one forward pass's sparse layers. ``replay``: expert ids [sparse layers, tokens, k] to use
    instead of the router's top-k (the tokens being the forward's [B, T] positions, flattened); entries below zero
    mean "route as the router does" for that token. With ``apply`` False the given ids are only compared with the
    router's own choice (``mismatch``), not used. ``record``: keep each layer's chosen ids (``chosen``).
    ``keep_logits``: keep each layer's router logits (``logits``), for the load-balancing loss."""

    def __init__(self, replay: Tensor | None = None, record: bool = False, keep_logits: bool = False,
                 apply: bool = True) -> None:
        self.replay = replay
        self.record = record
        self.keep_logits = keep_logits
        self.apply = apply
        self.chosen: list[Tensor] = []      # per sparse layer: int64 [tokens, k]
        self.logits: list[Tensor] = []      # per sparse layer: [tokens, E]
        self.recomputed: list[Tensor] = []  # with replay: the router's own top-k per sparse layer, [tokens, k]

    def choose(self, sparse_index: int, probs: Tensor, top_k: int) -> Tensor:
        """The expert ids [tokens, k] of the ``sparse_index``-th sparse layer given its router probabilities."""
        own = probs.topk(top_k, dim=-1).indices
        chosen = own
        if self.replay is not None:
            given = self.replay[sparse_index].to(device=probs.device, dtype=torch.long)
            if given.shape != own.shape:
                raise ValueError(f"the replayed routing of sparse layer {sparse_index} has shape "
                                 f"{tuple(given.shape)}; the forward routes {tuple(own.shape)}")
            if self.apply:
                chosen = torch.where(given >= 0, given, own)
            self.recomputed.append(own)
        if self.record:
            self.chosen.append(chosen)
        return chosen

    def silent(self) -> Routing:
        """The same routing rule (replay, apply) keeping nothing: what a layer recomputed for its backward pass
        (activation checkpointing) routes with. Its inputs and weights are those of its first pass, so it chooses
        the same experts; it must not record them twice."""
        return Routing(replay=self.replay, apply=self.apply)

    def stack(self) -> Tensor:
        """The recorded ids as one tensor [sparse layers, tokens, k]."""
        return torch.stack(self.chosen)

    def mismatches(self, tokens: Tensor | None = None) -> tuple[int, int]:
        """With ``replay``: (tokens whose router, left alone, chooses another set of experts in some sparse layer
        than the given one, tokens given in every sparse layer), over the rows ``tokens`` (default all)."""
        if self.replay is None or not self.recomputed:
            return 0, 0
        own = torch.stack(self.recomputed)
        given = self.replay.to(own.device)
        if tokens is not None:
            own, given = own[:, tokens], given[:, tokens]
        own, given = own.sort(dim=-1).values, given.sort(dim=-1).values
        replayed = (given >= 0).all(dim=-1).all(dim=0)                   # tokens
        differs = (own != given).any(dim=-1).any(dim=0) & replayed
        return int(differs.sum()), int(replayed.sum())

    def mismatch(self) -> float:
        """The share of given tokens whose own routing differs (see ``mismatches``); 0 when none was given."""
        differs, given = self.mismatches()
        return differs / given if given else 0.0


@torch.no_grad()
def routing_of(model: torch.nn.Module, token_ids: list[int]) -> np.ndarray:
    """The experts a forward pass of ``model`` over ``token_ids`` chooses: int32 [positions, sparse layers, top_k],
    the form of an actor's record (``forge.expert_routing``)."""
    device = next(model.parameters()).device
    routing = Routing(record=True)
    model(torch.tensor([token_ids], device=device), routing=routing)
    return routing.stack().transpose(0, 1).cpu().numpy().astype(np.int32)


def load_balancing_loss(logits: list[Tensor], top_k: int, tokens: Tensor | None = None) -> Tensor:
    """The Switch-Transformer auxiliary loss, averaged over sparse layers: num_experts times the sum over experts of
    (share of routed slots it received) x (its mean router probability); 1 when the load is uniform (Hugging Face's
    ``load_balancing_loss_func`` is top_k times this). ``tokens``: the rows to count (padding left out)."""
    losses = []
    for layer_logits in logits:
        if tokens is not None:
            layer_logits = layer_logits[tokens]
        probs = layer_logits.float().softmax(-1)
        experts = probs.shape[-1]
        chosen = probs.topk(top_k, dim=-1).indices
        share = torch.zeros(experts, device=probs.device).scatter_add_(
            0, chosen.reshape(-1), torch.ones(chosen.numel(), device=probs.device)) / max(1, chosen.numel())
        losses.append(experts * (share * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def expert_load(chosen: Tensor, num_experts: int) -> Tensor:
    """Tokens routed to each expert, per sparse layer: [sparse layers, E] from ids [sparse layers, tokens, k]."""
    layers = chosen.shape[0]
    counts = torch.zeros(layers, num_experts, dtype=torch.long, device=chosen.device)
    return counts.scatter_add_(1, chosen.reshape(layers, -1), torch.ones_like(chosen.reshape(layers, -1)))


class Experts(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inner))

    def forward(self, x: Tensor, expert_ids: Tensor, weights: Tensor) -> Tensor:
        """Outputs [N, H] for tokens ``x`` [N, H] routed to ``expert_ids`` [N, k] with ``weights`` [N, k]."""
        top_k = expert_ids.shape[-1]
        flat = expert_ids.reshape(-1)
        order = flat.argsort(stable=True)               # (token, slot) pairs grouped by expert, in token order
        token = order // top_k
        # a count per expert of a fixed size (bincount's size would depend on the ids, which a graph cannot take)
        counts = torch.zeros(self.gate_up_proj.shape[0], dtype=flat.dtype, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        ends = counts.cumsum(0)
        linear = _traced_grouped_linear if torch.compiler.is_compiling() else grouped_linear
        h = linear(x[token], self.gate_up_proj, ends, counts)
        gate, up = h.chunk(2, dim=-1)
        out = linear(F.silu(gate) * up, self.down_proj, ends, counts)
        out = out * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, token, out)


def grouped_linear(x: Tensor, weights: Tensor, ends: Tensor, counts: Tensor) -> Tensor:
    """``x`` [N, K] sorted into groups by expert (group e ends at row ``ends[e]``), each row times its expert's
    ``weights[e]`` [M, K] transposed: [N, M]."""
    if _grouped_mm_serves(x, weights):
        return F.grouped_mm(x, weights.transpose(1, 2), offs=ends.to(torch.int32))
    outputs, start = [], 0
    for expert, count in enumerate(counts.tolist()):
        if count:
            outputs.append(F.linear(x[start:start + count], weights[expert]))
            start += count
    return torch.cat(outputs) if outputs else x.new_zeros(0, weights.shape[1])


@torch.library.custom_op("forge::grouped_linear", mutates_args=())
def _grouped_linear_op(x: Tensor, weights: Tensor, ends: Tensor) -> Tensor:
    return grouped_linear(x, weights, ends, torch.diff(ends, prepend=ends.new_zeros(1)))


@_grouped_linear_op.register_fake
def _grouped_linear_shape(x: Tensor, weights: Tensor, ends: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weights.shape[1])


def _traced_grouped_linear(x: Tensor, weights: Tensor, ends: Tensor, counts: Tensor) -> Tensor:
    """``grouped_linear`` as a compiled graph calls it (inference only: the op has no backward)."""
    return _grouped_linear_op(x, weights, ends)


def _grouped_mm_serves(x: Tensor, weights: Tensor) -> bool:
    """grouped_mm runs on CPU in any floating dtype; on CUDA in bfloat16 with rows of 16-byte multiples."""
    if x.device.type == "cpu":
        return True
    return (x.device.type == "cuda" and x.dtype == torch.bfloat16 and weights.dtype == torch.bfloat16
            and x.shape[-1] % 8 == 0 and weights.shape[1] % 8 == 0)


class SparseMoE(nn.Module):
    """``mlp`` of a sparse decoder layer: ``gate`` (the router, [E, H]) and ``experts``."""

    def __init__(self, config: ModelConfig, sparse_index: int | None) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.sparse_index = sparse_index        # its place among the main stack's sparse layers; None in MTP layers
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config)

    def forward(self, x: Tensor, routing: Routing | None = None) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = self.gate(flat)
        probs = logits.float().softmax(-1)
        if routing is not None and self.sparse_index is not None:
            chosen = routing.choose(self.sparse_index, probs, self.top_k)
            if routing.keep_logits:
                routing.logits.append(logits)
        else:
            chosen = probs.topk(self.top_k, dim=-1).indices
        weights = probs.gather(-1, chosen)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return self.experts(flat, chosen, weights.to(x.dtype)).reshape(shape)
