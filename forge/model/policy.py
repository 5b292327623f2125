"""What the learner and the actors need of a model: the ``Policy`` protocol. Forge's own ``CausalLM``
(``forge.model.qwen3``, with experts from ``forge.model.moe``) and ``TransformersCausalLM``
(``forge.model.transformers_policy``, any family transformers implements) both implement it, and both are torch
modules (parameters, state dicts, devices and dtypes as ``nn.Module`` has them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from torch import Tensor, nn


class PolicyConfig(Protocol):
    """What is read of a policy's config: its family, vocabulary and depth, its end-of-sequence ids, its experts
    (none: 0 and ``()``) and its multi-token-prediction layers (none: 0)."""

    model_type: str
    vocab_size: int
    num_hidden_layers: int
    eos_token_ids: tuple[int, ...]
    sparse_layers: tuple[int, ...]
    num_experts: int
    num_experts_per_tok: int
    num_nextn_predict_layers: int

    def to_hf_dict(self) -> dict[str, Any]: ...


class Policy(Protocol):
    """A causal LM as the learner trains it and the actors serve it: hidden states from token ids (under an
    attention backend, with the experts' routing replayed where it has experts), logits from hidden states, its
    weights written as a Hugging Face checkpoint. ``mtp`` holds its multi-token-prediction drafts (empty: none;
    ``CausalLM`` alone has them, with ``mtp_forward`` and ``mtp_logits``)."""

    config: PolicyConfig
    mtp: nn.ModuleList

    @property
    def output_weight(self) -> Tensor: ...

    def __call__(self, input_ids: Tensor, position_ids: Tensor | None = None, attention: Any = None,
                 routing: Any = None) -> Tensor: ...

    def logits(self, hidden: Tensor) -> Tensor: ...

    def activation_checkpointing(self, on: bool = True) -> None: ...

    def save_pretrained(self, path: str | Path) -> Path: ...


__all__ = ["Policy", "PolicyConfig"]
