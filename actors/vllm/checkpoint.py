"""The checkpoint a vLLM actor serves: a staged copy without the tensors vLLM does not load, the facts the backend
reads of it whatever its family, the KV cache's size in tokens, and whether vLLM's grammars mask there as Forge's."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forge.actors.config import EngineConfig

log = logging.getLogger(__name__)

CPU_BLOCK_MULTIPLE = 32               # vLLM's CPU attention kernel takes blocks of a multiple of this
UNKNOWN_TO_VLLM = ("mtp.",)            # checkpoint tensors vLLM's Qwen3 does not load (Forge's MTP heads)


def vllm_tensor(name: str) -> bool:
    return not name.startswith(UNKNOWN_TO_VLLM)


def vllm_tensors(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """The tensors of ``tensors`` vLLM loads (not the MTP heads)."""
    return {name: tensor for name, tensor in tensors.items() if vllm_tensor(name)}


def serving_checkpoint(source: Path, staging: Path) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """A checkpoint directory vLLM can load, and the shapes of the tensors it serves: ``source`` itself when every
    tensor is one vLLM knows, else a copy in ``staging`` without the others (config and tokenizer files linked)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shards = sorted(source.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{source} holds no *.safetensors weights")
    shapes: dict[str, tuple[int, ...]] = {}
    unknown = False
    for shard in shards:
        with safe_open(shard, "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                if vllm_tensor(name):
                    shapes[name] = tuple(f.get_slice(name).get_shape())
                else:
                    unknown = True
    if not unknown:
        return source, shapes
    staging.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.suffix != ".safetensors" and item.name != "model.safetensors.index.json" and item.is_file():
            (staging / item.name).symlink_to(item.resolve())
    weight_map: dict[str, str] = {}
    for shard in shards:
        with safe_open(shard, "pt") as f:
            kept = {name: f.get_tensor(name) for name in f.keys() if vllm_tensor(name)}  # noqa: SIM118
        if kept:
            save_file(kept, staging / shard.name, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(kept, shard.name))
    if len(shards) > 1:
        (staging / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return staging, shapes


def structured_output_problem(directory: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> str | None:
    """Why vLLM's ``guidance`` backend, with the tokenizer vLLM loads from ``directory``, would not mask structured
    output as ``forge.sampling.grammar.Grammars`` does for this model (tokenizer.json, ``vocab_size``, every id of
    ``eos_token_ids`` ending a complete document), or None when it would."""
    if not (directory / "tokenizer.json").is_file():
        return f"{directory} has no tokenizer.json"
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend

    try:
        tokenizer = get_tokenizer(str(directory))
    except Exception as exc:          # any failure to load it means: no tokenizer
        return f"vLLM cannot load the tokenizer of {directory}: {exc}"
    if not GuidanceBackend.is_tokenizer_supported(tokenizer):
        return "vLLM's guidance backend takes fast (tokenizer.json) tokenizers only"
    if len(tokenizer) > vocab_size:
        return f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary of {vocab_size}"
    if set(eos_token_ids) != {tokenizer.eos_token_id}:
        return (f"the model's end-of-sequence ids are {list(eos_token_ids)}, but vLLM's grammars end a document with "
                f"the tokenizer's ({tokenizer.eos_token_id}) alone")
    return None


@dataclass(frozen=True)
class ServedModel:
    """What the backend reads of the model it serves, whatever its family."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    sparse_layers: tuple[int, ...] = ()
    num_experts: int = 0

    @property
    def is_moe(self) -> bool:
        return bool(self.sparse_layers)


def served_model(directory: Path) -> ServedModel:
    """The facts of the checkpoint in ``directory``: Forge's own config for the families it implements, else the
    family's transformers config (its text part)."""
    from forge.checkpoints import is_native

    if is_native(directory):
        from forge.model import ModelConfig

        c = ModelConfig.from_file(directory)
        return ServedModel(c.vocab_size, tuple(c.eos_token_ids), c.max_position_embeddings, c.num_hidden_layers,
                           c.num_key_value_heads, c.head_dim, tuple(c.sparse_layers), c.num_experts)
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(directory).get_text_config()
    eos = c.eos_token_id
    heads = c.num_attention_heads
    return ServedModel(c.vocab_size, (eos,) if isinstance(eos, int) else tuple(eos or ()), c.max_position_embeddings,
                       c.num_hidden_layers, getattr(c, "num_key_value_heads", None) or heads,
                       getattr(c, "head_dim", None) or c.hidden_size // heads)


def block_size_on(device: str, block_size: int) -> int:
    """The KV block size vLLM serves with on ``device``: its CPU attention takes multiples of CPU_BLOCK_MULTIPLE."""
    if device.startswith("cuda") or not block_size % CPU_BLOCK_MULTIPLE:
        return block_size
    rounded = block_size + CPU_BLOCK_MULTIPLE - block_size % CPU_BLOCK_MULTIPLE
    log.info("vLLM's CPU attention takes blocks of a multiple of %d tokens: blocks of %d", CPU_BLOCK_MULTIPLE, rounded)
    return rounded


def kv_token_capacity(model_config: Any, dtype: str, config: EngineConfig) -> int:
    """Tokens the KV cache of ``config.kv_cache_bytes`` holds (vLLM refuses to start when one request of its
    maximum length would not fit)."""
    element = torch.finfo(getattr(torch, dtype)).bits // 8
    per_token = 2 * model_config.num_hidden_layers * model_config.num_key_value_heads * model_config.head_dim * element
    blocks = config.kv_cache_bytes // per_token // CPU_BLOCK_MULTIPLE - 1       # vLLM keeps one block back
    return max(1, blocks) * CPU_BLOCK_MULTIPLE


def fast_tmp() -> str | None:
    """Memory-backed scratch space for staged weight versions where the machine has one."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
