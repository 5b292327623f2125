"""LoRA for the learner's policy: low-rank adapters (peft's LoRA layers) put into the policy's linear projections,
the only weights of the policy that train; and what the rest of the system needs of them: the merged weights under the
checkpoint's own names (what the actors and ``model/`` hold), and the adapter as a PEFT directory that
``peft.PeftModel.from_pretrained`` loads onto the transformers model of the same base checkpoint.

Both policies, Forge's own and the transformers-backed one, name their parameters as the checkpoint does
(``model.layers.N.self_attn.q_proj.weight``), so one set of target names serves every family: each attention and MLP
projection of the decoder layers (a family whose projections are named otherwise lists its own). Experts stored as one
stacked tensor are not linear modules and stay frozen; a dense layer's or a shared expert's projections are adapted.
The MTP draft is not adapted: it goes on training in full, being small and distilled from the policy.

The adapter's layers are peft's own (``peft.inject_adapter_in_model``), not a copy: what trains here is what peft
would train, which the tests check against ``peft.get_peft_model`` on the transformers model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import Tensor, nn

from forge.learner.lora_config import DEFAULT_TARGETS, LoraConfig
from forge.model.lora_weights import SCALING, merged_weight

ADAPTER = "default"                 # peft's name for a model's one adapter
DRAFT_PREFIX = "mtp."               # the MTP draft's modules: trained in full, never adapted
EXPERTS = "experts"                 # a layer's stacked experts (Forge's and transformers' MoE): frozen
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
SAVED_PREFIX = "base_model.model."  # where peft's saved keys start: the wrapped model's own names follow


def target_pattern(targets: tuple[str, ...]) -> str:
    """A regular expression over whole module names: a target name last, outside the draft and the experts."""
    names = "|".join(re.escape(t) for t in targets)
    return rf"^(?!{re.escape(DRAFT_PREFIX)})(?!.*\.{EXPERTS}\.)(?:.*\.)?(?:{names})$"


def target_modules(model: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """The linear modules of ``model`` that ``targets`` name."""
    pattern = re.compile(target_pattern(targets))
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and pattern.fullmatch(name)]


def add_adapters(model: nn.Module, config: LoraConfig) -> nn.Module:
    """Put ``config``'s adapters into ``model`` (in place; B starts at zero, so the policy is unchanged) and freeze
    everything else but the MTP draft. ValueError when no module is a target.

    peft takes a model with a ``config.model_type`` of a mixture of experts for a transformers checkpoint from before
    its experts were fused, and rewrites the targets to adapt the fused experts; the policy is handed to it inside a
    plain module, so that what is adapted is exactly the modules listed."""
    import peft

    modules = target_modules(model, config.targets)
    if not modules:
        raise ValueError(f"LoRA: no linear module of the policy is named {' or '.join(config.targets)}")
    holder = nn.Module()
    holder.add_module("policy", model)
    peft.inject_adapter_in_model(config.peft_config([f"policy.{name}" for name in modules]), holder,
                                 adapter_name=ADAPTER)
    for name, parameter in model.named_parameters():
        parameter.requires_grad = is_adapter(name) or name.startswith(DRAFT_PREFIX)
    return model


def adapted_modules(state: dict[str, Tensor]) -> list[str]:
    """The modules that carry adapters in ``state`` (a model's state dict, or its parameters' names)."""
    return sorted({name.rpartition(".lora_A.")[0] for name in state if ".lora_A." in name})


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merged_state_dict(state: dict[str, Tensor], config: LoraConfig) -> dict[str, Tensor]:
    """``state`` (a full state dict of a model with adapters) as the plain model's: each adapted weight
    W + scaling · B A, under its own name, in its own dtype (merged in float32)."""
    merged: dict[str, Tensor] = {}
    for name, value in state.items():
        if is_adapter(name):
            continue
        if ".base_layer." not in name:
            merged[name] = value
            continue
        module, _, leaf = name.rpartition(".base_layer.")
        if leaf == "weight":
            value = merged_weight(value, state[f"{module}.lora_A.{ADAPTER}.weight"],
                                  state[f"{module}.lora_B.{ADAPTER}.weight"], config.scaling)
        merged[f"{module}.{leaf}"] = value
    return merged


def adapter_version(state: dict[str, Tensor], config: LoraConfig) -> dict[str, Tensor]:
    """What an adapter version sends of ``state`` (a full state dict of a model with adapters): the adapters, the
    MTP draft and the scale (``forge.model.lora_weights``)."""
    version = {name.replace(f".{ADAPTER}.", "."): value for name, value in state.items() if is_adapter(name)}
    version.update((name, value) for name, value in state.items() if name.startswith(DRAFT_PREFIX))
    version[SCALING] = torch.tensor(config.scaling, dtype=torch.float32)
    return version


def adapter_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The adapter's weights of ``state`` under the names peft saves them with."""
    return {SAVED_PREFIX + name.replace(f".{ADAPTER}.", "."): value.detach().contiguous()
            for name, value in state.items() if is_adapter(name)}


def save_adapter(directory: str | Path, config: LoraConfig, state: dict[str, Tensor],
                 base_model: str | None = None) -> Path:
    """Write ``state``'s adapter as a PEFT directory (``adapter_config.json``, ``adapter_model.safetensors``)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    described = config.peft_config(adapted_modules(state)).to_dict()
    described["base_model_name_or_path"] = base_model
    described = {k: sorted(v) if isinstance(v, set) else v for k, v in described.items()}
    (directory / ADAPTER_CONFIG).write_text(json.dumps(described, indent=2, sort_keys=True) + "\n")
    save_file(adapter_state_dict(state), str(directory / ADAPTER_WEIGHTS))
    return directory


def load_adapter(directory: str | Path) -> dict[str, Tensor]:
    """A saved adapter's weights under the names they have in a model with adapters (``add_adapters``)."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(directory) / ADAPTER_WEIGHTS))
    loaded = {}
    for name, value in saved.items():
        if not name.startswith(SAVED_PREFIX) or not is_adapter(name):
            raise ValueError(f"{directory}: {name} is not a LoRA adapter's weight")
        module, _, leaf = name[len(SAVED_PREFIX):].rpartition(".lora_")
        loaded[f"{module}.lora_{leaf.split('.')[0]}.{ADAPTER}.weight"] = value
    return loaded


@torch.no_grad()
def set_adapter(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Copy ``weights`` (``load_adapter``'s) into ``model``'s adapters; ValueError unless they are exactly its."""
    own = {name: p for name, p in model.named_parameters() if is_adapter(name)}
    if set(own) != set(weights):
        missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
        raise ValueError(f"the adapter does not fit the policy: missing {missing[:3]}, unknown {extra[:3]}")
    for name, value in weights.items():
        if own[name].shape != value.shape:
            raise ValueError(f"the adapter's {name} is {tuple(value.shape)}, the policy's {tuple(own[name].shape)}")
        own[name].copy_(value)


__all__ = ["DEFAULT_TARGETS", "LoraConfig", "adapted_modules", "adapter_state_dict", "adapter_version", "add_adapters", "load_adapter",
           "merged_state_dict", "save_adapter", "set_adapter", "target_modules", "target_pattern",
           "trainable_parameters"]
