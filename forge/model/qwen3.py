"""The Qwen3-family decoder-only transformer (dense Qwen3, or Qwen3-MoE with sparse mixture-of-experts layers, see
``forge.model.moe``) with optional DeepSeek-V3-style multi-token-prediction (MTP) modules.

Parameter names follow the Hugging Face layout (``model.layers.N.self_attn.q_proj.weight`` …), so checkpoints load
and save without renaming. MTP module k (``mtp.k.*``) combines the hidden state at position t with the embedding
of token t + 1 + k and predicts token t + 2 + k through the shared output head.

The forward pass takes explicit position ids and an attention backend (``forge.model.attention``), which is how
the learner runs tree-packed sequences and the actor engine runs its paged KV cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from forge.model.attention import AttentionBackend, CausalAttention
from forge.model.checkpoint import check_state_dict, read_checkpoint, save_state_dict
from forge.model.config import ModelConfig
from forge.model.moe import Experts, Routing, SparseMoE


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)      # one fused op, same arithmetic
        # Normalised in fp32 and cast back before the weight, as the reference implementation does.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """The rotary embedding, scaled beyond the trained window as the config says (linear, YaRN, Llama 3): the
    frequencies and the attention factor of a scaled type come from transformers' own ``ROPE_INIT_FUNCTIONS``, so
    that a checkpoint rotates exactly as its reference does."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_factor = 1.0
        if config.rope_scaling:
            inv_freq, self.attention_factor = scaled_rope(config)
        else:
            exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64).float() / config.head_dim
            inv_freq = 1.0 / (config.rope_theta**exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of shape [B, 1, T, D] for position ids of shape [B, T]."""
        freqs = position_ids.float().unsqueeze(-1) * self.inv_freq.float()
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
        if self.attention_factor != 1.0:
            return (angles.cos() * self.attention_factor).to(dtype), (angles.sin() * self.attention_factor).to(dtype)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def scaled_rope(config: ModelConfig) -> tuple[Tensor, float]:
    """The inverse frequencies and attention factor of a scaled rotary embedding, computed by transformers for the
    transformers config of ``config``."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    reference = (transformers.Qwen3MoeConfig if config.is_moe else transformers.Qwen3Config)(**config.to_hf_dict())
    with torch.device("cpu"):               # also inside a model built on the meta device
        inv_freq, factor = ROPE_INIT_FUNCTIONS[config.rope_type](reference, torch.device("cpu"))
    return inv_freq.float(), float(factor)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionBackend) -> Tensor:
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        out = attention.attend(self.layer, rotate(q, cos, sin), rotate(k, cos, sin), v, self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor, routing: Routing | None = None) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config, layer)
        if config.is_sparse_layer(layer):
            sparse = config.sparse_layers
            self.mlp: SwiGLU | SparseMoE = SparseMoE(config, sparse.index(layer) if layer in sparse else None)
        else:
            self.mlp = SwiGLU(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionBackend,
                routing: Routing | None = None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        return x + self.mlp(self.post_attention_layernorm(x), routing)


def checkpointed(layer: DecoderLayer, x: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionBackend,
                 routing: Routing | None) -> Tensor:
    """``layer(x, …)`` with only ``x`` kept for the backward pass, which runs the layer again: its second run routes
    by the same rule without recording anything (``Routing.silent``), so what the first recorded is recorded once."""
    runs = [routing, None if routing is None else routing.silent()]

    def run(hidden: Tensor) -> Tensor:
        return layer(hidden, rope, attention, runs.pop(0))

    return torch.utils.checkpoint.checkpoint(run, x, use_reentrant=False)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class MTPModule(nn.Module):
    """One multi-token-prediction depth: norm both inputs, project their concatenation, run one decoder layer."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.pre_fc_norm_embedding = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layer = DecoderLayer(config, layer)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden: Tensor, next_embeds: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionBackend):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        return self.layer(x, rope, attention)


class CausalLM(nn.Module):
    """The policy model. ``forward`` returns hidden states; ``logits`` turns them into next-token logits."""

    # The output head's product, ``head_linear(x, output_weight)``: an inference engine may set another kernel for
    # it on its model (``forge.actors.engine.packed_linear``).
    head_linear: Callable[[Tensor, Tensor], Tensor] = staticmethod(F.linear)
    # Keep only each decoder layer's input for the backward pass and run the layer again there (set by the learner's
    # ``activation_checkpointing``): a layer's activations live during its own backward only.
    checkpoint_layers: bool = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.rotary = RotaryEmbedding(config)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, False)
        self.mtp = nn.ModuleList(
            MTPModule(config, config.num_hidden_layers + k) for k in range(config.num_nextn_predict_layers)
        )

    @property
    def output_weight(self) -> Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def rope(self, input_ids: Tensor, position_ids: Tensor | None) -> tuple[Tensor, Tensor]:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).expand(input_ids.shape)
        if position_ids.shape != input_ids.shape:
            raise ValueError(f"position_ids {tuple(position_ids.shape)} must match input_ids {tuple(input_ids.shape)}")
        return self.rotary(position_ids, self.model.embed_tokens.weight.dtype)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        attention: AttentionBackend | None = None,
        routing: Routing | None = None,
    ) -> Tensor:
        """Hidden states [B, T, H] of the last decoder layer (before the final norm) for token ids [B, T].

        ``position_ids`` default to 0..T-1 per row; ``attention`` defaults to causal attention within each row;
        ``routing`` records or replays the sparse layers' expert choices (a model with experts)."""
        attention = attention or CausalAttention()
        rope = self.rope(input_ids, position_ids)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            if self.checkpoint_layers and torch.is_grad_enabled():
                x = checkpointed(layer, x, rope, attention, routing)
            else:
                x = layer(x, rope, attention, routing)
        return x

    def activation_checkpointing(self, on: bool = True) -> None:
        """Recompute each decoder layer in the backward pass instead of keeping its activations."""
        self.checkpoint_layers = on

    def logits(self, hidden: Tensor) -> Tensor:
        return self.head_linear(self.model.norm(hidden), self.output_weight)

    def mtp_forward(
        self,
        hidden: Tensor,
        next_ids: Tensor,
        depth: int = 0,
        position_ids: Tensor | None = None,
        attention: AttentionBackend | None = None,
        detach_trunk: bool = False,
    ) -> Tensor:
        """Hidden states of MTP module ``depth``: ``hidden`` is the previous depth's output at each position t (the
        main model's for depth 0) and ``next_ids`` holds token t + 1 + depth at position t. ``detach_trunk`` keeps
        gradients out of the shared embeddings and the main model (co-training the draft only)."""
        if depth >= len(self.mtp):
            raise ValueError(f"the model has {len(self.mtp)} MTP module(s); depth {depth} does not exist")
        rope = self.rope(next_ids, position_ids)
        embeds = self.model.embed_tokens(next_ids)
        if detach_trunk:
            hidden, embeds = hidden.detach(), embeds.detach()
        return self.mtp[depth](hidden, embeds, rope, attention or CausalAttention())

    def mtp_logits(self, hidden: Tensor, depth: int = 0, detach_head: bool = False) -> Tensor:
        weight = self.output_weight.detach() if detach_head else self.output_weight
        return self.head_linear(self.mtp[depth].norm(hidden), weight)

    def init_weights(self, std: float = 0.02, seed: int | None = None) -> None:
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                with torch.no_grad():
                    weight = torch.empty(module.weight.shape).normal_(0.0, std, generator=generator)
                    module.weight.copy_(weight)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
            elif isinstance(module, Experts):
                with torch.no_grad():
                    for weight in (module.gate_up_proj, module.down_proj):
                        weight.copy_(torch.empty(weight.shape).normal_(0.0, std, generator=generator))
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> CausalLM:
        """The model of the Hugging Face checkpoint directory ``path`` (CheckpointError where it does not fit its
        config.json)."""
        config, state = read_checkpoint(path, dtype)
        with torch.device("meta"):
            model = cls(config)
        check_state_dict(path, state, dict(model.state_dict()))
        model.load_state_dict(state, assign=True)
        model.rotary = RotaryEmbedding(config)
        return model.to(device=device, dtype=dtype)

    def save_pretrained(self, path: str | Path, max_shard_bytes: int | None = None) -> Path:
        """Write config.json and the weights (shards of at most ``max_shard_bytes``, plus an index, when given)."""
        return save_state_dict(self.config, self.state_dict(), path, max_shard_bytes)
