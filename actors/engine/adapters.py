"""Named LoRA adapters served beside the base weights: several runs' policies decoded together by one engine.

Each run trains its own adapters on the same base checkpoint (``[learner] lora_publish = "adapters"``) and streams
them here under its name; every request names the adapter it is sampled with (``GenerationRequest.adapter``, empty
for the engine's own weights). The base weights stay as they are: in each adapted projection the rows of a step
that name an adapter add its side path, y = x Wᵀ + s · (x Aᵀ) Bᵀ, the very sum the learner's peft layers compute.
Merging instead (``forge.model.lora_weights``, what an actor with a single run does) would need a whole copy of the
model per adapter.

Every adapter of a projection is computed at once, whatever their number: their A matrices stacked ([Σ ranks, in]),
their B matrices side by side ([out, Σ ranks]), and a per-row mask that keeps a row's own adapter's columns, scaled
by its s, and zeroes the others (exactly: a zero term adds nothing), so a step costs two thin products, a multiply
and an add per adapted projection. The side path runs in forward hooks on the adapted ``nn.Linear`` modules, active
only inside ``ServedAdapters.rows`` on the calling thread (the engine's step), so the model is unchanged everywhere
else. An adapter of the output head (``lm_head``'s pair: Tinker's ``train_unembed``) has no module to hook, the
model's logits taking the output weight directly (a tied head is the embedding matrix): the engine's runner adds its
term to the logits rows itself (``head_delta``). The draft (MTP) tensors an
adapter version carries are not applied: speculative decoding drafts with the base model's MTP head for every
adapter, which leaves what is sampled exact (drafts are verified against the adapter's distribution) and costs
acceptance only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from forge.adapter_names import check_adapter_name
from forge.model.lora_weights import SCALING, A, B, check_named_adapter_version

HEAD = "lm_head"                    # the output head's adapter (Tinker's train_unembed): its pair is named after it
_active = threading.local()         # .scales: [rows, adapters] of this step (a row's adapter's s, zero elsewhere)


@dataclass(frozen=True)
class AdapterWeights:
    """One version of a named adapter, ready for the side path: per adapted module, A [rank, in] and B [out, rank]
    on the model's device and in its dtype."""

    name: str
    version: int
    scaling: float
    pairs: dict[str, tuple[Tensor, Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.pairs.values())


@dataclass(frozen=True)
class Stack:
    """The served adapters of one projection side by side: A [Σ ranks, in], B [out, Σ ranks], and the adapter
    (its slot in ``ServedAdapters``) each of the Σ ranks columns belongs to."""

    a: Tensor
    b: Tensor
    owners: Tensor


class ServedAdapters:
    """The named adapters one engine serves over its model, and the hooks that add their side paths."""

    def __init__(self, model: nn.Module) -> None:
        self._linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        output = getattr(model, "output_weight", None)       # the head's [vocab, hidden], tied or not
        self._head_shape = tuple(output.shape) if output is not None else None
        self._parameters = {name: tuple(p.shape) for name, p in model.state_dict().items()}
        weight = next(iter(model.parameters()))
        self._device, self._dtype = weight.device, weight.dtype
        self._served: dict[str, AdapterWeights] = {}
        self._slots: dict[str, int] = {}
        self._stacks: dict[str, Stack] = {}
        self._hooked: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self._served

    def __len__(self) -> int:
        return len(self._served)

    @property
    def versions(self) -> dict[str, int]:
        return {name: adapter.version for name, adapter in self._served.items()}

    def version(self, name: str) -> int:
        return self._served[name].version

    @property
    def nbytes(self) -> int:
        return sum(adapter.nbytes for adapter in self._served.values())

    def prepare(self, name: str, version: int, state: Mapping[str, Tensor]) -> AdapterWeights:
        """``state`` (an adapter version) checked against the model and made ready (off the engine's thread);
        ValueError when it does not fit."""
        check_adapter_name(name)
        check_named_adapter_version(name, version, state)
        modules = sorted({key.removesuffix(A) for key in state if key.endswith(A)})
        pairs = {}
        for module in modules:
            shape = self._head_shape if module == HEAD else getattr(self._linears.get(module), "weight", None)
            shape = tuple(shape.shape) if isinstance(shape, Tensor) else shape
            if shape is None or f"{module}{B}" not in state:
                raise ValueError(f"adapter {name!r}: {module} is not a linear projection of the model, or has no "
                                 "B matrix")
            a, b = state[f"{module}{A}"], state[f"{module}{B}"]
            out_features, in_features = shape
            if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape[0] != out_features \
                    or a.shape[0] != b.shape[1]:
                raise ValueError(f"adapter {name!r}: the pair of {module} ({tuple(b.shape)} x {tuple(a.shape)}) does "
                                 f"not fit its weight {shape}")
            pairs[module] = (a.to(self._device, self._dtype).contiguous(), b.to(self._device, self._dtype).contiguous())
        rest = [key for key in state if key != SCALING and not key.endswith((A, B))]
        strays = [key for key in rest if self._parameters.get(key) != tuple(state[key].shape)]
        unpaired = [key for key in state if key.endswith(B) and key.removesuffix(B) not in pairs]
        if strays or unpaired or not pairs:
            raise ValueError(f"adapter {name!r} does not fit the model: {len(pairs)} adapted modules, unknown "
                             f"{(strays + unpaired)[:5]}")
        return AdapterWeights(name, version, float(state[SCALING]), pairs)

    def install(self, adapter: AdapterWeights) -> None:
        """Serve ``adapter`` from the next step on (call between steps, on the engine's thread)."""
        for module in adapter.pairs.keys() - self._hooked - {HEAD}:     # the head has no module: see head_delta
            self._linears[module].register_forward_hook(self._side_path(module))
            self._hooked.add(module)
        self._slots.setdefault(adapter.name, len(self._slots))
        self._served[adapter.name] = adapter
        self._restack()

    def remove(self, name: str) -> None:
        """Serve ``name`` no more (call between steps, on the engine's thread); the slots of the others close up."""
        del self._served[name]
        self._slots = {served: slot for slot, served in enumerate(self._served)}
        self._restack()

    def _restack(self) -> None:
        used = {module for adapter in self._served.values() for module in adapter.pairs}
        self._stacks = {module: self._stack(module) for module in (self._hooked | {HEAD}) & used}

    def head_delta(self, x: Tensor, adapters: Sequence[str]) -> Tensor | None:
        """What the output head's adapters add to the logits of rows ``x`` (the final norm's output, [rows, hidden]),
        row ``i`` with adapter ``adapters[i]`` ("": none): s · (x Aᵀ) Bᵀ, as the learner adds it to the head's
        product; None when no row's adapter adapts the head. (The model's logits take the output weight directly, a
        tied head having no module, so the engine adds this itself.)"""
        stack = self._stacks.get(HEAD)
        if stack is None or not any(adapters):
            return None
        scales = torch.zeros(len(adapters), len(self._slots), dtype=self._dtype)
        for row, name in enumerate(adapters):
            if name and HEAD in self._served[name].pairs:
                scales[row, self._slots[name]] = self._served[name].scaling
        low = torch.matmul(x, stack.a.t())
        low.mul_(scales.to(self._device)[:, stack.owners])
        return torch.matmul(low, stack.b.t())

    def _stack(self, module: str) -> Stack:
        held = [(self._slots[a.name], *a.pairs[module]) for a in self._served.values() if module in a.pairs]
        owners = torch.tensor([slot for slot, a, _ in held for _ in range(a.shape[0])], device=self._device)
        return Stack(torch.cat([a for _, a, _ in held]), torch.cat([b for _, _, b in held], dim=1), owners)

    @contextmanager
    def rows(self, adapters: Sequence[str]) -> Iterator[None]:
        """Inside the block, on this thread, row ``i`` of every adapted projection's input is computed with adapter
        ``adapters[i]`` ("": none)."""
        if not any(adapters):
            yield
            return
        scales = torch.zeros(len(adapters), len(self._slots), dtype=self._dtype)
        for row, name in enumerate(adapters):
            if name:
                scales[row, self._slots[name]] = self._served[name].scaling
        outer = getattr(_active, "scales", None)
        _active.scales = scales.to(self._device)
        try:
            yield
        finally:
            _active.scales = outer

    def _side_path(self, module: str):
        """The forward hook of one adapted projection: adds, to each row's output, s · (x Aᵀ) Bᵀ of the row's
        adapter (in place: the engine runs under inference mode). An input whose rows were flattened with their
        positions (``[rows * positions, in]``, as a mixture of experts' router takes it) is viewed by row again."""

        def hook(_module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
            scales = getattr(_active, "scales", None)
            stack = self._stacks.get(module)
            if scales is None or stack is None:
                return
            x, rows = args[0], scales.shape[0]
            shaped = x.shape[0] == rows and x.dim() == 3
            x = x if shaped else x.view(rows, -1, x.shape[-1])
            low = torch.matmul(x, stack.a.t())
            low.mul_(scales[:, stack.owners].unsqueeze(1))
            delta = torch.matmul(low, stack.b.t())
            (output if shaped else output.view(rows, -1, output.shape[-1])).add_(delta)

        return hook


__all__ = ["AdapterWeights", "ServedAdapters"]
