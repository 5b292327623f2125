"""What each backend an actor can run does, and which one ``--backend auto`` takes for a model: the questions the
actor's settings, its factory (``forge.actors.factory``), the deployments and the serving backends themselves
(``Backend.kind``) ask, instead of testing a backend's name. It imports neither: the settings read it, and the
factories read the settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendKind:
    """One backend, by what it does beyond serving one run's weights."""

    name: str
    uses_l3_cache: bool = False         # publishes and fetches KV blocks in forge-cache (--l3-cache)
    hands_over: bool = False            # disaggregated serving: prefill and decode actors (--role)
    scores: bool = False                # scores prompts (GenerationRequest.score_from)
    serves_adapters: bool = False       # LoRA adapter versions, merged onto its weights or named (--adapter)
    caps_adapter_rank: bool = False     # serves named adapters up to --max-adapter-rank only (sized at start)
    follows_adapter_source: bool = False    # adds and drops named adapters at run time (--adapter-source)
    samples_model: bool = True          # samples the model's policy (a training run's actors must)


TORCH = BackendKind("torch", uses_l3_cache=True, hands_over=True, scores=True, serves_adapters=True,
                    follows_adapter_source=True)
VLLM = BackendKind("vllm", scores=True, serves_adapters=True, caps_adapter_rank=True)
TRTLLM = BackendKind("trtllm")
LOADTEST = BackendKind("loadtest", samples_model=False)     # tokens at a set pace from no model: middleware benches
KINDS = {kind.name: kind for kind in (TORCH, VLLM, TRTLLM, LOADTEST)}


def pick_backend(backend: str, model: str) -> tuple[str, str]:
    """The backend that serves ``model`` for ``--backend backend``, and why: ``auto`` takes the embedded torch engine
    for the families Forge implements and vLLM for any other."""
    if backend != "auto":
        return backend, "as asked"
    from forge.checkpoints import is_native, model_type

    if is_native(model):
        return TORCH.name, f"the embedded engine implements {model_type(model)}"
    return VLLM.name, f"the embedded engine does not implement {model_type(model)}"


def kind_of(backend: str) -> BackendKind:
    """What ``backend`` (a name ``pick_backend`` settled) does; an unknown name does none of it."""
    return KINDS.get(backend, BackendKind(backend))


def backends_that(does: str) -> tuple[str, ...]:
    """The names of the backends that do ``does`` (a field of ``BackendKind``: ``serves_adapters``, …)."""
    return tuple(name for name, kind in KINDS.items() if getattr(kind, does))
