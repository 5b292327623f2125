"""How an actor builds the vLLM backend: over a checkpoint directory (a built-in model that ships no weights is
written out first), in the checkpoint's dtype unless told, refused in one line where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import tempfile
from dataclasses import replace
from pathlib import Path

from forge.actors.backend import BackendFactory, Serving, StartContext
from forge.actors.config import VLLM_INSTALL_HINT, ActorConfig


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


class VllmFactory(BackendFactory):
    name = "vllm"

    def check(self, config: ActorConfig) -> None:
        if not vllm_installed():
            raise ValueError(VLLM_INSTALL_HINT)

    def build(self, config: ActorConfig, context: StartContext) -> Serving:
        from forge.actors.vllm.backend import VllmBackend
        from forge.checkpoints import checkpoint_dtype, resolve_model, write_builtin_checkpoint

        ref = resolve_model(config.model)
        if ref.builtin and not ref.has_weights:
            scratch = Path(tempfile.mkdtemp(prefix="forge-tiny-"))
            ref = resolve_model(write_builtin_checkpoint(scratch, ref.builtin_name or "tiny"))
        dtype = checkpoint_dtype(ref) if config.dtype == "auto" else config.dtype
        backend = VllmBackend(ref, replace(config.engine, threads=context.threads), dtype=dtype,
                              device=context.device, initial_version=context.initial_version,
                              adapters=len(config.adapters))
        return Serving(backend, ref.model_id, backend.kv_events())
