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

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

SCALING = "lora.scaling"
A, B = ".lora_A.weight", ".lora_B.weight"
PEFT_PREFIX = "base_model.model."          # what peft prefixes the module names of a saved adapter with


def merged_weight(weight: Tensor, a: Tensor, b: Tensor, scaling: float) -> Tensor:
    """W + scaling · B A, in float32 (one fused multiply-add), in W's dtype."""
    import torch

    return torch.addmm(weight.float(), b.float(), a.float(), alpha=scaling).to(weight.dtype)


def is_adapter_version(state: Mapping[str, Tensor]) -> bool:
    return SCALING in state


def check_named_adapter_version(name: str, version: int, state: Mapping[str, Tensor]) -> None:
    """ValueError unless ``state``, version ``version`` of the named adapter ``name``, is an adapter version."""
    if not is_adapter_version(state):
        raise ValueError(f"version {version} of adapter {name!r} holds whole-model weights, not LoRA adapters: a run "
                         "sharing the actor publishes adapters ([learner] lora_publish = \"adapters\")")


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


def adapter_rank(version: Mapping[str, Tensor]) -> int:
    """The largest rank of ``version``'s adapters."""
    return max((t.shape[0] for name, t in version.items() if name.endswith(A)), default=0)


def write_peft_directory(version: Mapping[str, Tensor], directory: Path) -> Path:
    """``version`` as a PEFT LoRA directory, which serving engines load as an adapter (vLLM's ``LoRARequest``): the
    adapters under peft's names, the scale folded into B and ``lora_alpha`` = rank (an engine that reads alpha as an
    integer still scales exactly), the adapted modules as its targets. The draft's tensors are left out."""
    from safetensors.torch import save_file

    scaling = float(version[SCALING])
    rank = adapter_rank(version)
    modules = sorted(name.removesuffix(A) for name in version if name.endswith(A))
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module in modules:
        tensors[f"{PEFT_PREFIX}{module}{A}"] = version[f"{module}{A}"].detach().to("cpu").contiguous()
        tensors[f"{PEFT_PREFIX}{module}{B}"] = (version[f"{module}{B}"].detach().to("cpu").float() * scaling).to(
            version[f"{module}{B}"].dtype).contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
              "bias": "none", "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules}),
              "use_rslora": False, "use_dora": False}
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


__all__ = ["PEFT_PREFIX", "SCALING", "adapter_rank", "check_named_adapter_version", "is_adapter_version", "merge_adapter_version", "merged_weight",
           "write_peft_directory"]
