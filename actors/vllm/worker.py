"""Methods Forge adds to vLLM's workers (``worker_extension_cls``), called through ``collective_rpc``: loading a
weight version in place. Imported inside vLLM's worker processes, so it imports nothing of Forge's.

Why not vLLM's ``reload_weights`` alone: its CPU build packs some weights at start-up into layouts that an in-place
reload does not rebuild.

- A tied LM head keeps a oneDNN copy of the embedding, so logits would come from the old embedding. After the
  reload the head is tied to the embedding again and every layer that shares its weight with another is packed
  again.
- Experts are packed for its grouped kernel once, when the kernel is built; on a reload the kernel already exists
  and the new weights stay in the checkpoint's layout, which the kernel reads as if packed. After the reload each
  expert weight is packed again, in place.
"""

from __future__ import annotations

from typing import Any


class ForgeWorkerExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker (``self.model_runner``, ``self.device``)."""

    model_runner: Any

    def forge_load_weights(self, weights_path: str) -> int:
        """Reload every tensor of the safetensors files in ``weights_path`` in place; returns how many layers were
        packed again (shared weights, experts)."""
        self.model_runner.reload_weights(weights_path=weights_path)
        return self._repack_shared_weights() + self._repack_experts()

    def _repack_experts(self) -> int:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return 0
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        repacked = 0
        for module in self.model_runner.get_model().modules():
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if not isinstance(experts, CPUUnquantizedExperts) or experts._use_zentorch:
                continue
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(module, name)
                weight.data.copy_(cpu_prepack_moe_weight(weight.data, experts.isa))
            repacked += 1
        return repacked

    def _repack_shared_weights(self) -> int:
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return 0
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        model = self.model_runner.get_model()
        head, embedding = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        if getattr(model.config, "tie_word_embeddings", False) and head is not None and embedding is not None:
            head.weight = embedding.weight          # a reload may have given the embedding a new parameter
        owners: dict[int, list[torch.nn.Module]] = {}
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.ndim == 2 and hasattr(module, "cpu_linear"):
                owners.setdefault(id(weight), []).append(module)
        repacked = 0
        for modules in owners.values():
            if len(modules) > 1:
                for module in modules:
                    dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                    repacked += 1
        return repacked
