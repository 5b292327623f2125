"""Any Hugging Face causal LM as the learner's policy: a model transformers implements (Llama, Qwen2, Mistral,
Gemma, Phi, OLMo, GLM, SmolLM, ...) behind the interface of Forge's own ``CausalLM`` (hidden states from token ids,
logits from hidden states, a config with what the learner reads), so the learner trains families Forge does not
implement itself.

The module holds the family's decoder as ``model`` and, unless tied to the embeddings, its ``lm_head``: parameter
names are the checkpoint's own, so the learner's checkpoints load in transformers and vLLM, and its weight versions
reach a vLLM actor by name. Logits are the family's: its output head, then whatever its ``*ForCausalLM`` does after
it (Gemma's final soft-capping, Cohere's and Granite's logit scales). Attention is Forge's, registered with
transformers (``forge.model.transformers_attention``): the family computes its queries, keys and values, and the
backend passed to ``forward`` attends, so the learner's prefix trees and stem work for every family, sliding windows
and soft-capped scores included. The policy trains without dropout, as the actors sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from forge.model.config import eos_token_ids
from forge.model.transformers_attention import register

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransformersConfig:
    """What the learner reads of a policy's config (``forge.model.policy.PolicyConfig``), for a transformers model
    (no experts replayed, no MTP), read once from the family's transformers config by ``read``."""

    hf: Any                             # the family's transformers config
    model_type: str
    vocab_size: int
    num_hidden_layers: int
    eos_token_ids: tuple[int, ...]
    sparse_layers: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    num_nextn_predict_layers: int = 0

    @classmethod
    def read(cls, hf: Any) -> TransformersConfig:
        """The one reading of a transformers config: the end-of-sequence ids as ``ModelConfig`` reads them."""
        return cls(hf, hf.model_type, hf.vocab_size, hf.num_hidden_layers,
                   eos_token_ids(getattr(hf, "eos_token_id", None)))

    def to_hf_dict(self) -> dict[str, Any]:
        return self.hf.to_dict()


def without_dropout(hf_config: Any) -> list[str]:
    """Set every dropout probability of a transformers config to 0; the names of those that were not."""
    changed = []
    for name, value in vars(hf_config).items():
        if (name.endswith("dropout") or name.endswith("pdrop")) and isinstance(value, float) and value > 0:
            setattr(hf_config, name, 0.0)
            changed.append(name)
    return changed


class TransformersCausalLM(nn.Module):
    """A transformers model behind the ``forge.model.policy.Policy`` interface."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.model = hf_model.get_decoder()
        head = hf_model.get_output_embeddings()
        self.tied = head.weight is self.model.get_input_embeddings().weight
        if not self.tied:
            self.lm_head = head
        hf_config = hf_model.config
        self.config = TransformersConfig.read(hf_config)
        self.mtp = nn.ModuleList()          # no multi-token-prediction draft to co-train
        self._softcap = getattr(hf_config, "final_logit_softcapping", None)
        self._scale = getattr(hf_config, "logit_scale", None)            # Cohere multiplies
        self._divide = getattr(hf_config, "logits_scaling", None)        # Granite divides

    @property
    def output_weight(self) -> Tensor:
        return self.model.get_input_embeddings().weight if self.tied else self.lm_head.weight

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, attention: Any = None,
                routing: Any = None) -> Tensor:
        """Hidden states [B, L, H] of ``input_ids`` [B, L] under ``attention`` (an ``AttentionBackend``; None:
        causal, right-padded rows keeping padding out of every real position)."""
        if routing is not None:
            raise ValueError("a transformers policy has no experts to route")
        return self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                          forge_backend=attention).last_hidden_state

    def activation_checkpointing(self, on: bool = True) -> None:
        """Recompute each decoder layer in the backward pass instead of keeping its activations (transformers' own
        gradient checkpointing, non-reentrant; it acts while the policy trains)."""
        enable = getattr(self.model, "activation_checkpointing_enable", None)     # the name from transformers 5.x
        if on and enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif on:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            getattr(self.model, "activation_checkpointing_disable", self.model.gradient_checkpointing_disable)()

    def logits(self, hidden: Tensor) -> Tensor:
        logits = nn.functional.linear(hidden, self.output_weight)
        if self._scale is not None:
            logits = logits * self._scale
        if self._divide is not None:
            logits = logits / self._divide
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def save_pretrained(self, path: str | Path) -> Path:
        from forge.model.checkpoint import save_state_dict

        return save_state_dict(self.config, self.state_dict(), path)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: str = "cpu") -> TransformersCausalLM:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.from_pretrained(str(path))
        if changed := without_dropout(hf_config):
            log.info("training without dropout, as the actors sample (was on: %s)", ", ".join(changed))
        model = AutoModelForCausalLM.from_pretrained(str(path), config=hf_config, dtype=dtype,
                                                     attn_implementation=register())
        return cls(model).to(device)


__all__ = ["TransformersCausalLM", "TransformersConfig"]
