"""Adapter versions: how a LoRA run's weight versions travel when only its adapters (and the MTP draft, which trains
in full) are sent, and how an actor turns one back into the whole model.

An adapter version is a plain state dict on the weight channel: ``{module}.lora_A.weight`` and
``{module}.lora_B.weight`` for every adapted module, the draft's tensors under their own names, and the adapters'
scale (alpha / rank) as a 0-d tensor named ``lora.scaling``. The actor merges it onto the weights it started from
(its ``--model``, the learner's base): W = W₀ + scale · B · A, computed in float32 and cast back, the very operation
the learner merges with, so the actor holds bit for bit the weights the learner's checkpoints hold. Merging on the
actor (rather than a LoRA side path in its forward) keeps decoding at full speed and the engine unchanged; it costs a
copy of the base weights, kept in host memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

SCALING = "lora.scaling"
A, B = ".lora_A.weight", ".lora_B.weight"


def merged_weight(weight: Tensor, a: Tensor, b: Tensor, scaling: float) -> Tensor:
    """W + scaling · B A, in float32 (one fused multiply-add), in W's dtype."""
    return torch.addmm(weight.float(), b.float(), a.float(), alpha=scaling).to(weight.dtype)


def is_adapter_version(state: Mapping[str, Tensor]) -> bool:
    return SCALING in state


def merge_adapter_version(base: Mapping[str, Tensor], version: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The whole model's weights: ``base`` with ``version``'s adapters merged and its other tensors (the draft's)
    taking their places. ValueError when the version does not fit ``base``."""
    scaling = float(version[SCALING])
    modules = {name.removesuffix(A) for name in version if name.endswith(A)}
    unknown = sorted(name for name in version if name != SCALING and name not in base
                     and not (name.endswith((A, B)) and f"{name.removesuffix(A).removesuffix(B)}.weight" in base))
    unpaired = sorted(m for m in modules if f"{m}{B}" not in version)
    if unknown or unpaired or len(version) != 1 + 2 * len(modules) + sum(n in base for n in version):
        raise ValueError(f"the adapter version does not fit the model: unknown {unknown[:5]}, unpaired {unpaired[:5]}")
    merged = {}
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in modules:
            a, b = version[f"{module}{A}"], version[f"{module}{B}"]
            if a.shape[1] != weight.shape[1] or b.shape[0] != weight.shape[0] or a.shape[0] != b.shape[1]:
                raise ValueError(f"the adapter of {module} ({tuple(b.shape)} x {tuple(a.shape)}) does not fit its "
                                 f"weight {tuple(weight.shape)}")
            merged[name] = merged_weight(weight, a.to(weight.device), b.to(weight.device), scaling)
        else:
            merged[name] = version.get(name, weight)
    return merged


__all__ = ["SCALING", "is_adapter_version", "merge_adapter_version", "merged_weight"]
