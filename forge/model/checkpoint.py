"""Loading and saving models in the Hugging Face layout: config.json plus safetensors, single-file or sharded.

A mixture-of-experts model keeps its experts stacked in memory (``mlp.experts.gate_up_proj`` [E, 2I, H],
``mlp.experts.down_proj`` [E, H, I]); its checkpoints hold one module per expert (``mlp.experts.{e}.gate_proj``,
``up_proj``, ``down_proj``), as the published Qwen3-MoE checkpoints and vLLM do. ``hub_layout`` and
``stacked_layout`` convert; loading accepts either."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from forge.model.config import ModelConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers that some exporters write but that are derived from the config.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded into the model its config describes."""


def weight_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    if (directory / SINGLE_FILE).exists():
        return [directory / SINGLE_FILE]
    raise CheckpointError(f"{directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def load_state_dict(directory: str | Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(Path(directory)):
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                tensor = handle.get_tensor(name)
                tensors[name] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    return tensors


_EXPERT_KEY = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def hub_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every stacked expert tensor split into one module per expert (the checkpoint layout); the
    experts' tensors are copies (safetensors refuses tensors that share storage)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name.removesuffix(".gate_up_proj")
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = gate[e].clone()
                out[f"{prefix}.{e}.up_proj.weight"] = up[e].clone()
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name.removesuffix(".down_proj")
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = tensor[e].clone()
        else:
            out[name] = tensor
    return out


def stacked_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with per-expert modules stacked as the model holds them (a stacked state is returned as it is).
    Raises CheckpointError where an expert's tensor is missing."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))
    for name, tensor in state.items():
        match = _EXPERT_KEY.match(name)
        if match is None:
            out[name] = tensor
        else:
            experts[match["experts"]][match["proj"]][int(match["index"])] = tensor
    for prefix, projections in experts.items():
        count = 1 + max(max(p) for p in projections.values())
        stacks = {}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            have = projections.get(proj, {})
            missing = [e for e in range(count) if e not in have]
            if missing:
                raise CheckpointError(f"{prefix}: no {proj} for experts {missing[:8]}")
            stacks[proj] = torch.stack([have[e] for e in range(count)])
        out[f"{prefix}.gate_up_proj"] = torch.cat([stacks["gate_proj"], stacks["up_proj"]], dim=1)
        out[f"{prefix}.down_proj"] = stacks["down_proj"]
    return out


def read_checkpoint(directory: str | Path, dtype: torch.dtype | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state dict) of the checkpoint in ``directory``, in the model's own layout: derived buffers dropped,
    experts stacked, a tied head left out."""
    directory = Path(directory)
    config = ModelConfig.from_file(directory)
    state = {k: v for k, v in load_state_dict(directory, dtype).items() if not k.endswith(_DERIVED_SUFFIXES)}
    if config.is_moe:
        state = stacked_layout(state)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return config, state


def check_state_dict(directory: str | Path, state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """CheckpointError unless ``state`` (read from ``directory``) has exactly the tensors and shapes ``expected``."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{directory} does not match its config: missing {missing[:8]}{'…' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'…' if len(unexpected) > 8 else ''}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"{name}: shape {tuple(tensor.shape)} in {directory}, {tuple(expected[name].shape)}"
                                  " expected by config.json")


def save_state_dict(config: ModelConfig, state_dict: dict[str, torch.Tensor], directory: str | Path,
                    max_shard_bytes: int | None = None) -> Path:
    """Write config.json and the weights in the Hugging Face layout; shards of at most ``max_shard_bytes`` (plus an
    index) when given."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in hub_layout(dict(state_dict)).items()}
    dtype_name = str(next(iter(state.values())).dtype).removeprefix("torch.")
    config_data = config.to_hf_dict() | {"torch_dtype": dtype_name, "dtype": dtype_name}
    (directory / "config.json").write_text(json.dumps(config_data, indent=2, sort_keys=True) + "\n")
    for stale in [*directory.glob("model-*-of-*.safetensors"), directory / SINGLE_FILE, directory / INDEX_FILE]:
        stale.unlink(missing_ok=True)
    shards = _shard(state, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], directory / SINGLE_FILE, metadata={"format": "pt"})
        return directory
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return directory


def _shard(state: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    if not max_bytes:
        return [state]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards
