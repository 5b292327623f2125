"""The reference KL: a penalty keeping the policy near a frozen reference, ``kl_coef`` times an estimator of
KL(π ‖ π_ref) over the sampled tokens, normalised as the policy loss is.

The estimators are Schulman's (2020, http://joschu.net/blog/kl-approx.html), with ρ = log π_ref(y_t) − log π(y_t)
and the gradient through log π alone (the reference is frozen):

- k1 = −ρ (unbiased, high variance; its gradient is the score function's),
- k2 = ½ ρ² (low variance, biased),
- k3 = e^ρ − 1 − ρ (unbiased, positive, low variance: GRPO's, arXiv:2402.03300).

The reference is the starting checkpoint (a frozen copy the learner loads at start); with LoRA it is the base model
itself, run with its adapters switched off (``adapters_off``): no second copy of the weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from forge.learner.loss_config import LossConfig
from forge.learner.losses import sequence_mean


def kl_terms(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Each token's estimate of KL(π ‖ π_ref) (``estimator`` k1, k2 or k3), with the gradient of ``logp``."""
    log_ratio = ref_logp.detach() - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.exp(log_ratio) - 1.0 - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}: k1, k2 or k3")


def normalised(config: LossConfig, terms: Tensor, mask: Tensor, sample_index: Tensor, total_tokens: float,
               total_sequences: float) -> Tensor:
    """Per-token ``terms`` summed with the policy loss's normalisation (``config``): each sequence's mean over the
    global sequences for GRPO and ``token_norm sequence``, the global tokens for DAPO and ``token``, the constant
    S · L for Dr. GRPO (N when L is 0)."""
    kind = "custom" if config.function is not None else config.kind
    if kind == "grpo" or (kind not in ("dapo", "dr_grpo") and config.token_norm == "sequence"):
        return sequence_mean(terms, mask, sample_index, total_sequences)
    if kind == "dr_grpo" and config.dr_grpo_max_tokens > 0:
        return (terms * mask).sum() / (total_sequences * config.dr_grpo_max_tokens)
    return (terms * mask).sum() / total_tokens


def kl_loss(config: LossConfig, logp: Tensor, ref_logp: Tensor, mask: Tensor, sample_index: Tensor,
            total_tokens: float, total_sequences: float) -> Tensor:
    """The reference KL of a micro-batch (before ``kl_coef``), normalised as the policy loss."""
    return normalised(config, kl_terms(logp, ref_logp, config.kl_estimator), mask, sample_index, total_tokens,
                      total_sequences)


def _lora_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [module for module in model.modules() if isinstance(module, BaseTunerLayer)]


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Run ``model`` (with LoRA adapters) as its base model inside the block. peft's layers skip their adapters
    while ``disable_adapters`` holds; the flag is set directly rather than through ``enable_adapters``, which would
    also switch the adapters' ``requires_grad`` off and on (the optimizer's parameters, sharded under FSDP2)."""
    layers = _lora_layers(model)
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, flag in zip(layers, before, strict=True):
            layer._disable_adapters = flag


def frozen(model: nn.Module) -> nn.Module:
    """``model`` as a reference: no parameter takes gradients, evaluation mode."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval()
