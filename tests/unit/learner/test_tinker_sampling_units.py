"""The Tinker server's sampling, apart from the actors: the published set of sampler adapters (eviction of the least
recently used idle one, never one in use), its versions, the names adapters are served under, the sampling
parameters sent to the actor, stop strings, and sampler weights turned into an adapter version."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from forge.adapter_names import check_adapter_name
from forge.learner.tinker.actor_generate import sampling_message, stop_cut
from forge.learner.tinker.adapter_set import AdapterSet, VersionClock, adapter_name
from forge.learner.tinker.sampling import ActorSampling, adapter_version_of
from forge.learner.tinker.types import SampleParams, UserError
from forge.model.adapter_bundle import decode_bundle
from forge.model.lora_weights import SCALING


def tensors(value: float) -> dict[str, torch.Tensor]:
    return {SCALING: torch.tensor(2.0), "w.lora_A.weight": torch.full((1, 2), value)}


def test_the_least_recently_used_idle_adapter_is_evicted_never_one_in_use():
    adapters = AdapterSet(capacity=2)
    a, _ = adapters.add("p/a", tensors(1.0), 1)
    b, _ = adapters.add("p/b", tensors(2.0), 2)
    adapters.use(a)
    adapters.use(b)
    adapters.release(b)
    adapters.release(a)                        # both idle; a used last
    c, evicted = adapters.add("p/c", tensors(3.0), 3)
    assert evicted is b and set(adapters.names()) == {"p/a", "p/c"}
    adapters.use(a)
    adapters.use(c)
    assert not adapters.can_add()
    with pytest.raises(ValueError, match="all 2 published adapters are in use"):
        adapters.add("p/d", tensors(4.0), 4)
    adapters.release(c)
    assert adapters.can_add() and adapters.victim() is c
    d, evicted = adapters.add("p/d", tensors(4.0), 4)
    adapters.put_back(d, evicted)              # its bundle could not be published
    assert set(adapters.names()) == {"p/a", "p/c"}


def test_the_set_is_one_bundle_of_its_adapters_under_their_names_and_versions():
    adapters = AdapterSet(capacity=3)
    adapters.add("tinker://m/sampler_weights/x", tensors(1.0), 10)
    adapters.add("tinker://m/sampler_weights/y", tensors(2.0), 11)
    bundle = decode_bundle(adapters.bundle())
    assert {name: version for name, (version, _) in bundle.items()} == {
        adapter_name("tinker://m/sampler_weights/x"): 10, adapter_name("tinker://m/sampler_weights/y"): 11}
    assert decode_bundle(AdapterSet(capacity=1).bundle()) == {}


def test_adapter_names_are_valid_and_distinct_and_versions_only_grow():
    names = {adapter_name(f"tinker://model/sampler_weights/{i}" + "/x" * 50) for i in range(100)}
    assert len(names) == 100 and all(check_adapter_name(name) for name in names)
    clock = VersionClock()
    versions = [clock.next() for _ in range(1000)]
    assert versions == sorted(set(versions)) and versions[0] > 1_600_000_000 * 10**6    # microseconds: any restart
    assert VersionClock().next() > versions[0]                                          # is newer still


def test_sampling_parameters_go_to_the_actor_as_it_reads_them():
    message = sampling_message(SampleParams(max_tokens=5, temperature=0.7, top_k=-1, top_p=0.9, seed=3,
                                            stop_tokens=(7, 9)), index=2)
    assert (message.max_tokens, message.top_k, message.seed, list(message.stop_token_ids)) == (5, 0, 5, [7, 9])
    assert message.temperature == pytest.approx(0.7) and message.top_p == pytest.approx(0.9) and not message.ignore_eos
    unbounded = sampling_message(SampleParams(stop_at_eos=False), index=0)
    assert unbounded.ignore_eos and unbounded.max_tokens == 0 and not unbounded.HasField("seed")
    assert sampling_message(SampleParams(seed=2**63 - 1), index=1).seed == 0
    with pytest.raises(UserError, match="top_p"):
        sampling_message(SampleParams(top_p=1.5), index=0)
    with pytest.raises(UserError, match="temperature"):
        sampling_message(SampleParams(temperature=-1.0), index=0)


def test_a_stop_string_cuts_after_the_token_that_completes_it():
    pieces = {1: "Hel", 2: "lo", 3: " Wor", 4: "ld", 5: "!"}

    def decode(tokens) -> str:
        return "".join(pieces[t] for t in tokens)

    assert stop_cut([1, 2, 3, 4, 5], decode, ["o W"]) == 3
    assert stop_cut([1, 2, 3, 4, 5], decode, ["!", "lo"]) == 2
    assert stop_cut([1, 2, 3, 4, 5], decode, ["xyz"]) is None


def test_sampler_weights_become_an_adapter_version():
    saved = {"base_model.model.w.lora_A.default.weight": np.ones((1, 2), dtype=np.float32),
             "w.lora_B.weight": torch.ones(2, 1).t().t(), SCALING: torch.tensor(0.5)}
    version = adapter_version_of(saved)
    assert set(version) == {"w.lora_A.weight", "w.lora_B.weight", SCALING}
    assert all(t.is_contiguous() and t.device.type == "cpu" for t in version.values())
    with pytest.raises(RuntimeError, match=r"no 'lora\.scaling'"):
        adapter_version_of({"w.lora_A.weight": torch.ones(1, 2)})


def test_the_sampler_refuses_no_actors_and_bad_addresses():
    with pytest.raises(ValueError, match="at least one actor"):
        ActorSampling(object(), (), None, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    with pytest.raises(ValueError):
        ActorSampling(object(), ("no port",), None, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


def test_a_new_adapter_waits_for_room_while_every_published_one_is_in_use():
    class Weights:
        def __init__(self) -> None:
            self.reads: list[str] = []

        def sampler_weights(self, path: str):
            self.reads.append(path)
            return None, tensors(1.0)

    weights = Weights()
    sampling = ActorSampling(weights, ("127.0.0.1:1",), None, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")

    async def capacity() -> int:
        return 1

    sampling._capacity = capacity

    async def scenario() -> None:
        sampling._bind_loop()
        first = await sampling._acquire("p/a")
        waiting = asyncio.create_task(sampling._acquire("p/b"))
        while "p/b" not in weights.reads:
            await asyncio.sleep(0.01)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and set(sampling.published) == {"p/a"}
        await sampling._release(first)
        second = await waiting
        assert set(sampling.published) == {"p/b"} and second.version > first.version
        bundle = decode_bundle(sampling._set.bundle())
        assert list(bundle) == [second.name]
        await sampling.close()

    asyncio.run(scenario())
