"""An actor's adapter source (``--adapter-source``): the bundle a publisher sends (``forge.model.adapter_bundle``),
the follower that turns each bundle into loads and drops (``forge.actors.adapter_source``), the torch engine dropping
a named adapter, and the settings that go with it."""

from __future__ import annotations

import pytest
import torch

from forge.actors.adapter_source import SourceFollower
from forge.actors.backend import GenerationRequest, InvalidRequest, Ledger
from forge.actors.config import ActorConfig
from forge.model.adapter_bundle import COUNT, decode_bundle, encode_bundle
from forge.model.lora_weights import SCALING, A, B
from forge.sampling.params import SamplingParams
from forge.settings import SettingsError

from helpers.engines import engine_for, full_forward_logprobs
from helpers.learner_runs import make_model
from helpers.lora import adapted_run
from helpers.random_model import copy_of


def adapter(value: float) -> dict[str, torch.Tensor]:
    return {SCALING: torch.tensor(2.0), f"w{A}": torch.full((1, 2), value), f"w{B}": torch.full((2, 1), value)}


def test_a_bundle_carries_each_adapter_with_its_version_and_round_trips():
    state = encode_bundle({"a": (3, adapter(1.0)), "b-2.x": (7, adapter(2.0))})
    assert int(state[COUNT]) == 2 and state["a/adapter.version"].dtype == torch.int64
    bundle = decode_bundle(state)
    assert {name: version for name, (version, _) in bundle.items()} == {"a": 3, "b-2.x": 7}
    assert set(bundle["a"][1]) == {SCALING, f"w{A}", f"w{B}"}
    assert torch.equal(bundle["b-2.x"][1][f"w{A}"], torch.full((1, 2), 2.0))
    assert decode_bundle(encode_bundle({})) == {}          # an empty set is a version too


@pytest.mark.parametrize("state, problem", [
    ({"w.weight": torch.ones(1)}, "not an adapter bundle"),
    ({COUNT: torch.tensor(2), "a/adapter.version": torch.tensor(1), f"a/w{A}": torch.ones(1)}, "holds 1"),
    ({COUNT: torch.tensor(1), f"a/w{A}": torch.ones(1)}, "no integer 'adapter.version'"),
    ({COUNT: torch.tensor(1), "a/adapter.version": torch.tensor(1.0), f"a/w{A}": torch.ones(1)}, "no integer"),
    ({COUNT: torch.tensor(1), "a/adapter.version": torch.tensor(1)}, "has no tensors"),
    ({COUNT: torch.tensor(1), "stray": torch.ones(1)}, "not named ADAPTER/KEY"),
    ({COUNT: torch.tensor(1), "bad name/adapter.version": torch.tensor(1), "bad name/x": torch.ones(1)},
     "adapter name"),
])
def test_a_malformed_bundle_is_refused(state, problem):
    with pytest.raises(ValueError, match=problem):
        decode_bundle(state)


def test_a_bundle_refuses_bad_names_versions_and_a_tensor_named_like_the_version():
    with pytest.raises(ValueError, match="adapter name"):
        encode_bundle({"a/b": (1, adapter(1.0))})
    with pytest.raises(ValueError, match="negative"):
        encode_bundle({"a": (-1, adapter(1.0))})
    with pytest.raises(ValueError, match="may not be named"):
        encode_bundle({"a": (1, {**adapter(1.0), "adapter.version": torch.tensor(1)})})


class RecordingBackend:
    """A backend's named-adapter calls, recorded, with the ledger's rules (``refuse``: names it refuses)."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.ledger = Ledger(0, max_in_flight=1)
        self.calls: list[tuple] = []
        self.refuse = refuse

    def load_adapter(self, name, version, tensors):
        if name in self.refuse:
            raise ValueError("does not fit")
        self.ledger.accept_adapter(name, version)
        self.calls.append(("load", name, version))

    def unload_adapter(self, name):
        self.ledger.drop_adapter(name)
        self.calls.append(("drop", name))


def test_the_follower_loads_new_and_changed_adapters_drops_the_gone_and_leaves_the_rest():
    backend = RecordingBackend()
    follower = SourceFollower(backend, capacity=2)
    follower.apply(10, encode_bundle({"a": (10, adapter(1.0))}))
    follower.apply(11, encode_bundle({"a": (10, adapter(1.0)), "b": (11, adapter(2.0))}))
    follower.apply(12, encode_bundle({"b": (11, adapter(2.0)), "c": (12, adapter(3.0))}))     # a evicted for c
    follower.apply(13, encode_bundle({"b": (11, adapter(2.0)), "a": (13, adapter(1.0))}))     # a back, newer
    assert backend.calls == [("load", "a", 10), ("load", "b", 11), ("drop", "a"), ("load", "c", 12),
                             ("drop", "c"), ("load", "a", 13)]
    assert backend.ledger.adapters == {"b": 11, "a": 13} == follower.served
    assert follower.figures() == {"adapter_source_version": 13.0, "adapter_source_capacity": 2.0,
                                  "adapter_source_adapters": 2.0, "adapter_source_refused": 0.0}


def test_the_follower_refuses_a_set_over_capacity_and_what_the_backend_or_its_runs_refuse():
    backend = RecordingBackend(refuse=("bad",))
    follower = SourceFollower(backend, capacity=3, reserved=("run-a",))
    follower.apply(1, encode_bundle({"a": (1, adapter(1.0))}))
    follower.apply(2, encode_bundle({name: (2, adapter(1.0)) for name in "wxyz"}))     # over capacity
    assert follower.served == {"a": 1} and follower.applied_version == 2 and follower.refused == 1
    follower.apply(3, encode_bundle({"a": (1, adapter(1.0)), "bad": (3, adapter(1.0)), "run-a": (3, adapter(1.0))}))
    assert follower.served == {"a": 1} and follower.refused == 3 and follower.applied_version == 3
    follower.apply(4, {"w.weight": torch.ones(1)})                   # not a bundle: refused, nothing changes
    assert follower.served == {"a": 1} and follower.refused == 4 and follower.applied_version == 4


def test_a_restarted_publisher_with_older_versions_gets_its_adapters_reloaded():
    backend = RecordingBackend()
    follower = SourceFollower(backend, capacity=2)
    follower.apply(100, encode_bundle({"a": (100, adapter(1.0))}))
    follower.apply(101, encode_bundle({"a": (5, adapter(1.5))}))
    assert backend.calls[1:] == [("drop", "a"), ("load", "a", 5)] and follower.served == {"a": 5}


def test_the_ledger_forgets_a_dropped_adapter():
    ledger = Ledger(0, max_in_flight=1)
    ledger.accept_adapter("a", 4)
    ledger.drop_adapter("a")
    with pytest.raises(InvalidRequest, match="no adapter named 'a'"):
        ledger.check_adapter_named(GenerationRequest("r", [1], SamplingParams(), adapter="a"))
    ledger.accept_adapter("a", 1)                         # any version may come again
    with pytest.raises(ValueError, match="no adapter named 'b'"):
        ledger.drop_adapter("b")


def test_the_engine_drops_an_adapter_and_serves_the_others_and_a_new_one_exactly():
    base = make_model(1)
    runs = {name: adapted_run(base, seed) for name, seed in (("a", 2), ("b", 3), ("c", 4))}
    engine = engine_for(copy_of(base))
    sampled = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=5)
    prompt = [3, 1, 4, 1, 5]

    def sample(name: str) -> tuple[list[int], list[float]]:
        tokens, logprobs = [], []
        for chunk in engine.submit(GenerationRequest("", prompt, sampled, adapter=name)):
            assert not chunk.error, chunk.error
            tokens += chunk.token_ids
            logprobs += chunk.logprobs
        return tokens, logprobs

    try:
        engine.load_adapter("a", 1, runs["a"][0])
        engine.load_adapter("b", 1, runs["b"][0])
        sample("a")
        engine.unload_adapter("a")
        with pytest.raises(InvalidRequest, match="no adapter named 'a'"):
            engine.submit(GenerationRequest("", prompt, sampled, adapter="a"))
        with pytest.raises(ValueError, match="no adapter named 'a'"):
            engine.unload_adapter("a")
        engine.load_adapter("c", 1, runs["c"][0])
        for name in ("b", "c"):
            tokens, logprobs = sample(name)
            assert logprobs == pytest.approx(full_forward_logprobs(runs[name][1], prompt, tokens, sampled), abs=1e-4)
        assert engine.adapter_versions == {"b": 1, "c": 1}
        engine.unload_adapter("b")
        engine.unload_adapter("c")
        tokens, logprobs = sample("")
        assert logprobs == pytest.approx(full_forward_logprobs(base, prompt, tokens, sampled), abs=1e-4)
        assert engine.adapter_versions == {}
    finally:
        engine.close()


def test_requests_in_flight_on_a_dropped_adapter_end_with_an_error():
    base = make_model(1)
    engine = engine_for(copy_of(base))
    try:
        engine.load_adapter("a", 1, adapted_run(base, 2)[0])
        stream = engine.submit(GenerationRequest("", [1, 2], SamplingParams(max_tokens=200, ignore_eos=True),
                                                 adapter="a"))
        engine.unload_adapter("a")
        chunks = list(stream)
        assert chunks[-1].error in ("", "adapter 'a' is no longer served here")   # finished first, or ended
        assert chunks[-1].error or sum(len(c.token_ids) for c in chunks) == 200
    finally:
        engine.close()


def test_the_adapter_source_settings():
    config = ActorConfig(adapter_source="tcp://127.0.0.1:5721,tcp://127.0.0.1:5722", source_adapters=3)
    assert config.source_link.fetch == "tcp://127.0.0.1:5721" and config.source_link.server_key is None
    with pytest.raises(ValueError, match="FETCH,ANNOUNCE"):
        ActorConfig(adapter_source="tcp://127.0.0.1:5721")
    with pytest.raises(SettingsError, match="does not go with --weights-fetch"):
        ActorConfig(adapter_source="tcp://127.0.0.1:5721,tcp://127.0.0.1:5722",
                    weights_fetch="tcp://127.0.0.1:5701", weights_announce="tcp://127.0.0.1:5702")
    with pytest.raises(SettingsError, match="needs the torch backend"):
        ActorConfig(adapter_source="tcp://127.0.0.1:5721,tcp://127.0.0.1:5722", backend="vllm")
    with pytest.raises(SettingsError, match="--role"):
        ActorConfig(adapter_source="tcp://127.0.0.1:5721,tcp://127.0.0.1:5722", role="decode",
                    l3_cache="127.0.0.1:1")
    with pytest.raises(ValueError):
        ActorConfig(adapter_source="tcp://127.0.0.1:5721,tcp://127.0.0.1:5722", source_adapters=0)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_an_adapter_of_the_output_head_adds_its_term_to_the_logits(tied):
    """Tinker's train_unembed: the head's pair (``lm_head.lora_A/B.weight``) adds s · (x Aᵀ) Bᵀ to the logits, x the
    final norm's output, whether the head is tied to the embeddings (no module at all) or not."""
    import dataclasses

    from helpers.learner_runs import CONFIG

    base = make_model(1, dataclasses.replace(CONFIG, tie_word_embeddings=tied))
    version, merged = adapted_run(base, 2)
    generator = torch.Generator().manual_seed(9)
    head_a = torch.randn(4, base.config.hidden_size, generator=generator) * 0.3
    head_b = torch.randn(base.config.vocab_size, 4, generator=generator) * 0.3
    scaling = float(version[SCALING])
    merged.head_linear = lambda x, weight: torch.nn.functional.linear(x, weight) + scaling * (x @ head_a.t()) @ head_b.t()
    engine = engine_for(copy_of(base))
    sampled = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=3)
    prompt = [3, 1, 4, 1, 5]
    try:
        engine.load_adapter("a", 1, {**version, f"lm_head{A}": head_a, f"lm_head{B}": head_b})
        outputs = {}
        for name in ("a", ""):
            tokens, logprobs = [], []
            for chunk in engine.submit(GenerationRequest("", prompt, sampled, adapter=name)):
                tokens += chunk.token_ids
                logprobs += chunk.logprobs
            outputs[name] = (tokens, logprobs)
        tokens, logprobs = outputs["a"]
        assert logprobs == pytest.approx(full_forward_logprobs(merged, prompt, tokens, sampled), abs=1e-4)
        tokens, logprobs = outputs[""]                     # the base's rows are untouched
        assert logprobs == pytest.approx(full_forward_logprobs(base, prompt, tokens, sampled), abs=1e-4)
        with pytest.raises(ValueError, match="does not fit"):
            engine.load_adapter("b", 1, {**version, f"lm_head{A}": head_a, f"lm_head{B}": head_b[:-1]})
    finally:
        engine.close()
