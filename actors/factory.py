"""The one place an actor's backend is picked: every backend's factory by the name ``--backend`` gives it, once
``forge.actors.kinds`` has settled ``auto`` (the rule, and what each backend does, live there, below the settings
that check them). A new backend is a ``forge.actors.backend.BackendFactory`` beside its implementation, registered
here, and its ``BackendKind`` in ``forge.actors.kinds``."""

from __future__ import annotations

from forge.actors.backend import BackendFactory
from forge.actors.engine.factory import TorchFactory
from forge.actors.loadtest.factory import LoadTestFactory
from forge.actors.trtllm.factory import TrtllmFactory
from forge.actors.vllm.factory import VllmFactory

FACTORIES: dict[str, type[BackendFactory]] = {f.name: f for f in (TorchFactory, VllmFactory, TrtllmFactory, LoadTestFactory)}


def factory_for(name: str) -> BackendFactory:
    try:
        return FACTORIES[name]()
    except KeyError:
        raise ValueError(f"no backend {name!r} (one of {', '.join(FACTORIES)})") from None
