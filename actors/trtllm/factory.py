"""How an actor builds the TensorRT-LLM backend: over a checkpoint directory (a built-in model that ships no weights
is written out first)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from forge.actors.backend import BackendFactory, Serving, StartContext
from forge.actors.config import ActorConfig


def trtllm_backend(model: str, max_waiting: int):
    """(backend, id): TensorRT-LLM over ``model``; raises ModelNotFound (a ValueError) for a bad reference,
    RuntimeError where TensorRT-LLM cannot run."""
    from forge.actors.trtllm.backend import TrtllmBackend
    from forge.checkpoints import resolve_model, write_builtin_checkpoint
    from forge.model import ModelConfig

    ref = resolve_model(model)
    directory = ref.directory
    if ref.builtin and not ref.has_weights:
        directory = write_builtin_checkpoint(Path(tempfile.mkdtemp(prefix="forge-tiny-")), ref.builtin_name or "tiny")
    config = ModelConfig.from_file(directory)
    backend = TrtllmBackend(str(directory), config.vocab_size, config.max_position_embeddings,
                            config.eos_token_ids, max_waiting=max_waiting)
    return backend, ref.model_id


class TrtllmFactory(BackendFactory):
    name = "trtllm"

    def build(self, config: ActorConfig, context: StartContext) -> Serving:
        backend, model_id = trtllm_backend(config.model, config.engine.max_waiting)
        return Serving(backend, model_id)
