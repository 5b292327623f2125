"""The parts an actor is built from: its policy, the TensorRT-LLM backend, the torch engine's KV connector and the
learner's weight subscription. Shared by ``forge-actor``, the engine core (which builds them in its own process),
``forge model eval`` and the benches; errors are plain exceptions for each caller to report its own way."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("forge.actor")


def model_id_of(model: str) -> str:
    """The id ``model`` serves under (KV salts, stats); raises ValueError when it names no checkpoint."""
    from forge.builtin import TINY_NAME, is_builtin

    if is_builtin(model):
        return TINY_NAME
    path = Path(model)
    if not (path / "config.json").exists():
        raise ValueError(f"{model} is not a checkpoint directory (no config.json) nor 'tiny'")
    return str(path.resolve())


def load_policy(model: str, device: str, dtype: str):
    """(model, id) for ``model``: a checkpoint directory, or 'tiny' (its shipped weights, else a fresh init)."""
    import torch

    from forge.builtin import TINY_DIR, is_builtin, tiny_model
    from forge.model import CausalLM

    torch_dtype = getattr(torch, dtype)
    model_id = model_id_of(model)
    if is_builtin(model):
        if any(TINY_DIR.glob("*.safetensors")):
            return CausalLM.from_pretrained(TINY_DIR, dtype=torch_dtype, device=device), model_id
        log.warning("the built-in tiny model has no trained weights in this installation: using a fresh init")
        return tiny_model(seed=0).to(device=device, dtype=torch_dtype), model_id
    return CausalLM.from_pretrained(Path(model), dtype=torch_dtype, device=device), model_id


def trtllm_backend(model: str, max_waiting: int):
    """(backend, id): TensorRT-LLM over a checkpoint directory (the tiny model is written out first if needed);
    raises RuntimeError where TensorRT-LLM cannot run."""
    import tempfile

    from forge.actors.trtllm import TrtllmBackend
    from forge.builtin import TINY_DIR, TINY_NAME, is_builtin, write_tiny_checkpoint
    from forge.model import ModelConfig

    directory = TINY_DIR if is_builtin(model) else Path(model)
    if is_builtin(model) and not any(TINY_DIR.glob("*.safetensors")):
        directory = write_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="forge-tiny-")))
    config = ModelConfig.from_file(directory)
    backend = TrtllmBackend(str(directory), config.vocab_size, config.max_position_embeddings,
                            config.eos_token_ids, max_waiting=max_waiting)
    return backend, TINY_NAME if is_builtin(model) else str(directory.resolve())


def kv_connector(engine, l3_cache: str | None, fetch: str, api_key: str | None):
    """The torch engine's KV connector: KV events for routers always, the L3 cache when ``l3_cache`` names its
    servers; raises ValueError for a bad server list."""
    from forge.actors.engine.l3 import KVConnector

    client = None
    if l3_cache:
        from forge.cache.client import CacheClient

        client = CacheClient(l3_cache, api_key=api_key)
        log.info("L3 KV cache on %s (fetch: %s)", ", ".join(client.servers), fetch)
    return KVConnector(engine, client, fetch=fetch)


def weight_subscriber(backend, fetch: str, announce: str):
    """Follow the learner's weight versions into ``backend``; a version it refuses (wrong tensors, stale) is logged
    and the current one keeps serving."""
    from forge.weights import WeightSubscriber

    def apply(version: int, tensors: dict) -> None:
        try:
            backend.load_weights(version, tensors)
        except ValueError as exc:
            log.error("weight version %d refused: %s", version, exc)

    return WeightSubscriber(fetch, announce, on_version=apply)
