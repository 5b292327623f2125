"""What every backend keeps alike (``forge.actors.backend.Ledger``), and what each backend does, asked of its kind
(``forge.actors.kinds``) rather than by its name."""

from __future__ import annotations

import pytest
import torch

from forge.actors.backend import GenerationRequest, InvalidRequest, Ledger, Overloaded
from forge.actors.config import BACKENDS
from forge.actors.factory import FACTORIES
from forge.actors.kinds import KINDS, BackendKind, backends_that, kind_of
from forge.model.lora_weights import SCALING, A, B
from forge.sampling.params import SamplingParams


def test_versions_must_be_newer_than_the_newest_accepted():
    ledger = Ledger(3, max_in_flight=1)
    with pytest.raises(ValueError, match="weight version 3 is not newer than 3"):
        ledger.accept_version(3)
    ledger.accept_version(5)
    with pytest.raises(ValueError, match="weight version 4 is not newer than 5"):
        ledger.check_version(4)
    ledger.accept_adapter("a", 0)
    with pytest.raises(ValueError, match="version 0 of adapter 'a' is not newer than 0"):
        ledger.accept_adapter("a", 0)
    ledger.accept_adapter("a", 1)
    assert ledger.adapters == {"a": 1}


def test_requests_in_flight_are_admitted_up_to_the_limit_and_name_served_adapters_only():
    ledger = Ledger(0, max_in_flight=1)
    with pytest.raises(Overloaded, match="shutting down"):
        ledger.admit("r1", None, "the engine is shutting down")
    ledger.admit("r1", "entry")
    with pytest.raises(Overloaded, match="1 requests in flight; the queue is full, retry later"):
        ledger.admit("r2", "entry")
    assert ledger.refused == 1 and ledger.live == {"r1": "entry"}
    ledger.max_in_flight = 2
    with pytest.raises(InvalidRequest, match="request id 'r1' is already in flight"):
        ledger.admit("r1", "again")
    request = GenerationRequest("r3", [1], SamplingParams(), adapter="b")
    with pytest.raises(InvalidRequest, match=r"no adapter named 'b' is served here \(serving: none\)"):
        ledger.check_adapter_named(request)
    ledger.check_adapter_named(request, also={"b": 2})


def test_adapter_versions_merge_onto_the_base_unless_whole_weights_came_first():
    base = {"w.weight": torch.ones(2, 2)}
    adapter = {SCALING: torch.tensor(1.0), f"w{A}": torch.ones(1, 2), f"w{B}": torch.ones(2, 1)}
    ledger = Ledger(0, max_in_flight=1)
    merged = ledger.whole_weights(adapter, lambda: dict(base), "the test's weights")
    assert torch.equal(merged["w.weight"], torch.full((2, 2), 2.0))
    assert ledger.whole_weights(base, lambda: {}, "unused") is base
    late = Ledger(0, max_in_flight=1)
    late.whole_weights(base, lambda: {}, "unused")
    with pytest.raises(ValueError, match="a LoRA adapter version came after whole-model versions"):
        late.whole_weights(adapter, lambda: dict(base), "the test's weights")



def test_what_each_backend_does_is_asked_of_its_kind_and_every_kind_has_a_factory():
    assert kind_of("torch").uses_l3_cache and kind_of("torch").hands_over
    assert not kind_of("vllm").uses_l3_cache and kind_of("vllm").caps_adapter_rank
    assert not kind_of("trtllm").serves_adapters
    assert kind_of("no such backend") == BackendKind("no such backend")
    assert backends_that("serves_adapters") == ("torch", "vllm")
    assert not kind_of("loadtest").samples_model and kind_of("trtllm").samples_model
    assert set(KINDS) == set(FACTORIES) and BACKENDS == ("auto", "torch", "vllm", "trtllm", "loadtest")


def test_a_serving_backend_says_what_it_does_from_its_kind():
    """The serving backends answer ``hands_over``, ``scores`` and their name from ``forge.actors.kinds``, the one
    place the settings and the deployments read too."""
    from forge.actors.engine.engine import TorchEngine
    from forge.actors.engine.process import EngineProcess
    from forge.actors.loadtest.backend import LoadTestBackend

    for backend in (TorchEngine, EngineProcess, LoadTestBackend):
        assert KINDS[backend.kind.name] is backend.kind
    assert TorchEngine.kind.hands_over and TorchEngine.kind.scores and kind_of("vllm").scores
    assert not LoadTestBackend.kind.hands_over and not LoadTestBackend.kind.scores and not kind_of("trtllm").scores
