"""One base model shared by every client model trained on it: the base is loaded once and frozen, and each client
model is a LoRA adapter on it, held by name (peft's own layers, ``peft.inject_adapter_in_model``, several adapters per
layer), switched on for the call that uses it. Calls run one at a time, so exactly one adapter is active in a pass.

Which projections an adapter covers follows Tinker's LoRA configuration: ``train_attn`` (q, k, v, o), ``train_mlp``
(gate, up, down) and ``train_unembed`` (the output head). The policies compute their logits from the output weight
directly (a tied head has no module at all), so the output head's adapter is Forge's own low-rank term added to the
head's product, the same W + s·B·A as peft's: initialised as peft initialises (A Kaiming-uniform, B zero), and saved
under peft's names for ``lm_head``. The scale is Tinker's: alpha 32 over the rank (``LORA_ALPHA``).

An adapter's weights are named here as in a model with them merged away: ``model.layers.0.self_attn.q_proj.lora_A
.weight`` (``canonical`` names); saved PEFT directories prefix them with ``base_model.model.``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from forge.checkpoints.load import load_model
from forge.checkpoints.reference import ModelRef
from forge.learner.lora import target_pattern
from forge.learner.tinker.types import LoraSpec, UserError
from forge.model.lora_weights import PEFT_PREFIX, SCALING

LORA_ALPHA = 32.0               # Tinker's LoRA alpha (LoRA Without Regret; the cookbook's adapters say lora_alpha 32)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
HEAD = "lm_head"
NO_ADAPTER = "__base__"         # the name activated for a pass under the base weights alone
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def targets_of(spec: LoraSpec) -> tuple[str, ...]:
    return (ATTENTION if spec.train_attn else ()) + (MLP if spec.train_mlp else ())


def check_spec(spec: LoraSpec) -> None:
    """UserError for a LoRA configuration that trains nothing or has a bad rank or seed."""
    if not isinstance(spec.rank, int) or isinstance(spec.rank, bool) or not 1 <= spec.rank <= 4096:
        raise UserError(f"LoRA rank must be an integer from 1 to 4096, not {spec.rank!r}")
    if spec.seed is not None and (not isinstance(spec.seed, int) or not 0 <= spec.seed < 2**63):
        raise UserError(f"LoRA seed must be a non-negative integer, not {spec.seed!r}")
    if not (spec.train_attn or spec.train_mlp or spec.train_unembed):
        raise UserError("this LoRA configuration trains nothing: set train_attn, train_mlp or train_unembed")


class SharedBase:
    """A frozen base model and its client models' adapters, keyed by model id."""

    def __init__(self, reference: str | Path | ModelRef, device: str = "cpu", dtype: str = "float32") -> None:
        self.policy, self.ref = load_model(reference, dtype=dtype, device=device)
        self.policy.requires_grad_(False)
        self.policy.eval()
        self.holder = nn.Module()           # peft is given the policy inside a plain module (see forge.learner.lora)
        self.holder.add_module("policy", self.policy)
        self.specs: dict[str, LoraSpec] = {}
        self.head_a = nn.ParameterDict()
        self.head_b = nn.ParameterDict()
        self.active = NO_ADAPTER
        self._install_head()

    @property
    def hidden_size(self) -> int:
        return int(self.policy.output_weight.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.policy.config.vocab_size)

    # The output head's adapter.
    def head_delta(self, x: Tensor) -> Tensor | None:
        if self.active not in self.head_a:
            return None
        a, b = self.head_a[self.active], self.head_b[self.active]
        return F.linear(F.linear(x.to(a.dtype), a), b) * (LORA_ALPHA / self.specs[self.active].rank)

    def _install_head(self) -> None:
        """Route the policy's output head through ``head_delta``: Forge's models by their ``head_linear`` hook (on
        the final norm's output), transformers' by their logits (before any soft-capping)."""
        policy = self.policy
        if hasattr(type(policy), "head_linear"):
            def head_linear(x: Tensor, weight: Tensor) -> Tensor:
                out, delta = F.linear(x, weight), self.head_delta(x)
                return out if delta is None else out + delta.to(out.dtype)

            policy.head_linear = head_linear
            return

        def logits(hidden: Tensor) -> Tensor:
            out, delta = F.linear(hidden, policy.output_weight), self.head_delta(hidden)
            out = out if delta is None else out + delta.to(out.dtype)
            if policy._scale is not None:
                out = out * policy._scale
            if policy._divide is not None:
                out = out / policy._divide
            if policy._softcap is not None:
                out = torch.tanh(out / policy._softcap) * policy._softcap
            return out

        policy.logits = logits

    # Adapters.
    def modules_for(self, spec: LoraSpec) -> list[str]:
        """The policy's linear modules an adapter of ``spec`` covers (whether they hold other adapters already)."""
        import peft

        targets = targets_of(spec)
        if not targets:
            return []
        pattern = re.compile(target_pattern(targets))
        return [name for name, module in self.policy.named_modules()
                if isinstance(module, nn.Linear | peft.tuners.lora.LoraLayer) and pattern.fullmatch(name)]

    def add(self, model_id: str, spec: LoraSpec) -> None:
        """Put a fresh adapter for ``model_id`` on the base (deterministic for ``spec.seed``)."""
        import peft

        check_spec(spec)
        modules = self.modules_for(spec)
        if targets_of(spec) and not modules:
            raise UserError(f"the base model {self.ref.reference} has no projection named "
                            f"{' or '.join(targets_of(spec))} to put LoRA on")
        seed = spec.seed if spec.seed is not None else int(torch.randint(0, 2**62, ()).item())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if modules:
                config = peft.LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                                         target_modules=[f"policy.{name}" for name in modules])
                with warnings.catch_warnings():        # peft warns of a second adapter: several are the point
                    warnings.filterwarnings("ignore", "Already found a `peft_config`", UserWarning)
                    peft.inject_adapter_in_model(config, self.holder, adapter_name=model_id)
            if spec.train_unembed:
                weight = self.policy.output_weight
                a = torch.empty(spec.rank, self.hidden_size, dtype=torch.float32)
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))         # as peft initialises lora_A
                self.head_a[model_id] = nn.Parameter(a.to(weight.device))
                self.head_b[model_id] = nn.Parameter(torch.zeros(self.vocab_size, spec.rank, device=weight.device))
        self.specs[model_id] = spec
        for parameter in self.parameters(model_id).values():
            parameter.requires_grad_(False)

    def remove(self, model_id: str) -> None:
        import peft

        if self.active == model_id:
            self.activate(None)
        for module in self.policy.modules():
            if isinstance(module, peft.tuners.lora.LoraLayer) and model_id in module.lora_A:
                module.delete_adapter(model_id)
        for table in (self.head_a, self.head_b):
            if model_id in table:
                del table[model_id]
        self.specs.pop(model_id, None)

    def activate(self, model_id: str | None) -> None:
        """Make ``model_id``'s adapter the one every pass uses (None: the base alone); its weights train, no other's."""
        import peft

        name = NO_ADAPTER if model_id is None else model_id
        for module in self.policy.modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.set_adapter(name)
        self.active = name
        for other in self.specs:
            for parameter in self.parameters(other).values():
                parameter.requires_grad_(other == name)

    def parameters(self, model_id: str) -> dict[str, nn.Parameter]:
        """``model_id``'s adapter weights by canonical name, sorted by name."""
        infix = f".{model_id}."
        found = {name.replace(infix, "."): p for name, p in self.policy.named_parameters()
                 if infix in name and (".lora_A." in name or ".lora_B." in name)}
        if model_id in self.head_a:
            found[f"{HEAD}.lora_A.weight"] = self.head_a[model_id]
            found[f"{HEAD}.lora_B.weight"] = self.head_b[model_id]
        return dict(sorted(found.items()))

    def state(self, model_id: str) -> dict[str, Tensor]:
        return {name: p.detach().clone() for name, p in self.parameters(model_id).items()}

    @torch.no_grad()
    def load(self, model_id: str, weights: dict[str, Tensor]) -> None:
        """Copy ``weights`` (canonical names) into ``model_id``'s adapter; UserError unless they fit it exactly."""
        own = self.parameters(model_id)
        if set(own) != set(weights):
            missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
            raise UserError(f"the checkpoint's adapter does not fit this model's LoRA configuration: missing "
                            f"{missing[:3]}, unexpected {extra[:3]}")
        for name, value in weights.items():
            if own[name].shape != value.shape:
                raise UserError(f"the checkpoint's {name} is {tuple(value.shape)}, this model's "
                                f"{tuple(own[name].shape)} (another LoRA rank?)")
        for name, value in weights.items():
            own[name].copy_(value.to(own[name].dtype))

    # PEFT directories.
    def save_adapter(self, model_id: str, directory: Path) -> None:
        """``model_id``'s adapter as a PEFT directory (``adapter_config.json``, ``adapter_model.safetensors``)."""
        from safetensors.torch import save_file

        spec = self.specs[model_id]
        weights = self.state(model_id)
        modules = sorted({name.rpartition(".lora_")[0] for name in weights})
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": LORA_ALPHA,
                  "lora_dropout": 0.0, "bias": "none", "target_modules": modules,
                  "base_model_name_or_path": str(self.ref.reference), "fan_in_fan_out": False,
                  "inference_mode": True}
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file({PEFT_PREFIX + name: value.contiguous() for name, value in weights.items()},
                  str(directory / ADAPTER_WEIGHTS))


def read_adapter(directory: Path) -> dict[str, Tensor]:
    """A saved adapter's weights under their canonical names."""
    from safetensors.torch import load_file

    return {name.removeprefix(PEFT_PREFIX): value for name, value in load_file(str(directory / ADAPTER_WEIGHTS)).items()}


def adapter_version(weights: dict[str, Tensor], rank: int) -> dict[str, Tensor]:
    """A saved adapter as the actors take one (``forge.model.lora_weights``): its weights and the scale."""
    return {**weights, SCALING: torch.tensor(LORA_ALPHA / rank, dtype=torch.float32)}

