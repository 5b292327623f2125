"""The parts an actor is built from: its policy, the vLLM and TensorRT-LLM backends, the torch engine's KV connector,
the learner's weight subscription and the relay that re-serves it to other actors. Shared by ``forge-actor``, the
engine core (which builds them in its own process), ``forge model eval`` and the benches; errors are plain
exceptions for each caller to report its own way."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("forge.actor")


def model_id_of(model: str) -> str:
    """The id ``model`` serves under (KV salts, stats); raises ModelNotFound (a ValueError) when it names no
    model. Loads nothing."""
    from forge.builtin import resolve_model

    return resolve_model(model).model_id


def load_policy(model: str, device: str, dtype: str):
    """(model, id) for ``model``: a checkpoint directory, or a built-in model (its shipped weights, else a fresh
    init)."""
    from forge.builtin import load_model

    policy, ref = load_model(model, dtype=dtype, device=device)
    return policy, ref.model_id


def trtllm_backend(model: str, max_waiting: int):
    """(backend, id): TensorRT-LLM over a checkpoint directory (the tiny model is written out first if needed);
    raises ModelNotFound (a ValueError) for a bad reference, RuntimeError where TensorRT-LLM cannot run."""
    import tempfile

    from forge.actors.trtllm import TrtllmBackend
    from forge.builtin import resolve_model, write_builtin_checkpoint
    from forge.model import ModelConfig

    ref = resolve_model(model)
    directory = ref.directory
    if ref.builtin and not ref.has_weights:
        directory = write_builtin_checkpoint(Path(tempfile.mkdtemp(prefix="forge-tiny-")), ref.builtin_name or "tiny")
    config = ModelConfig.from_file(directory)
    backend = TrtllmBackend(str(directory), config.vocab_size, config.max_position_embeddings,
                            config.eos_token_ids, max_waiting=max_waiting)
    return backend, ref.model_id


def vllm_backend(model: str, config, device: str, dtype: str, initial_version: int):
    """(backend, id): vLLM over a checkpoint directory (the tiny model is written out first if it ships no
    weights); raises ModelNotFound (a ValueError) for a bad reference, RuntimeError where vLLM cannot run."""
    import tempfile

    from forge.actors.vllm_backend import VllmBackend
    from forge.builtin import checkpoint_dtype, resolve_model, write_builtin_checkpoint

    ref = resolve_model(model)
    if ref.builtin and not ref.has_weights:
        scratch = Path(tempfile.mkdtemp(prefix="forge-tiny-"))
        ref = resolve_model(write_builtin_checkpoint(scratch, ref.builtin_name or "tiny"))
    if dtype == "auto":
        dtype = checkpoint_dtype(ref)
    return VllmBackend(ref, config, dtype=dtype, device=device, initial_version=initial_version), ref.model_id


def kv_connector(engine, l3_cache: str | None, fetch: str, api_key: str | None):
    """The torch engine's KV connector: KV events for routers always, the L3 cache when ``l3_cache`` names its
    servers; raises ValueError for a bad server list."""
    from forge.actors.engine.l3 import KVConnector

    client = None
    if l3_cache:
        from forge.kv.client import CacheClient

        client = CacheClient(l3_cache, api_key=api_key)
        log.info("L3 KV cache on %s (fetch: %s)", ", ".join(client.servers), fetch)
    return KVConnector(engine, client, fetch=fetch)


def weight_subscriber(backend, fetch: str, announce: str, curve=None, relay=None):
    """Follow the learner's weight versions into ``backend`` (over CURVE with ``curve``, a
    ``forge.weights.curve.ClientKeys``); a version it refuses (wrong tensors, stale) is logged and the current one
    keeps serving. ``relay`` (a ``forge.weights.WeightRelay``) re-serves every verified version to other actors."""
    from forge.weights import WeightSubscriber

    def apply(version: int, tensors: dict) -> None:
        try:
            backend.load_weights(version, tensors)
        except ValueError as exc:
            log.error("weight version %d refused: %s", version, exc)

    return WeightSubscriber(fetch, announce, on_version=apply, curve=curve,
                            on_verified=relay.serve if relay is not None else None)


def weight_relay(fetch: str, announce: str, curve=None):
    """A ``forge.weights.WeightRelay`` bound to ``fetch`` and ``announce`` (over CURVE with ``curve``, a
    ``forge.weights.curve.ServerKeys``: this actor's key pair and the directory of the actors it serves); raises
    OSError when an endpoint cannot be bound."""
    from forge.weights import WeightRelay

    return WeightRelay(fetch, announce, curve=curve)
