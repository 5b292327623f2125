"""Weights from the learner's publisher to actors over ZeroMQ: applied at a step boundary, stamped on every token,
never torn, and a corrupted version is refused while the old one keeps serving."""

from __future__ import annotations

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.model.generate import generate
from forge.sampling.params import SamplingParams
from forge.weights import Faults, WeightPublisher, WeightSubscriber

from helpers.random_model import random_model, small_config
from helpers.waiting import wait_for

CONFIG = small_config(vocab_size=97, hidden_size=48, intermediate_size=96, head_dim=12)


def test_published_versions_apply_between_steps_and_corrupted_ones_are_refused():
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine = TorchEngine(random_model(CONFIG, 0, std=0.2), EngineConfig(kv_cache_bytes=4 * 2**20, block_size=8))
    publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=4096,
                                faults=Faults(corrupt_chunks={(2, 1)}))
    subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint,
                                  on_version=engine.load_weights, poll_interval_s=0.1)
    try:
        stream = engine.submit(GenerationRequest("", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2000,
                                                                                 ignore_eos=True)))
        first = stream.get(timeout=30)
        one = random_model(CONFIG, 1, std=0.2)
        publisher.publish(1, one.state_dict())
        assert subscriber.wait_for_version(1, timeout=30) and engine.wait_for_version(1, timeout=30)
        engine.abort(stream.request_id)
        versions = [v for chunk in [first, *stream] for v in chunk.weight_versions]
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        fresh = [t for c in engine.submit(GenerationRequest("", [4, 5], greedy)) for t in c.token_ids]
        assert fresh == generate(one, [4, 5], greedy).token_ids

        publisher.publish(2, random_model(CONFIG, 2, std=0.2).state_dict())          # chunk 1 is corrupted on the wire
        wait_for(lambda: subscriber.stats.versions_rejected >= 1, "the corrupted version's rejection")
        assert engine.weight_version == 1
        still = [t for c in engine.submit(GenerationRequest("", [4, 5], greedy)) for t in c.token_ids]
        assert still == fresh

        three = random_model(CONFIG, 3, std=0.2)
        publisher.publish(3, three.state_dict())
        assert engine.wait_for_version(3, timeout=30)
        after = [t for c in engine.submit(GenerationRequest("", [4, 5], greedy)) for t in c.token_ids]
        assert after == generate(three, [4, 5], greedy).token_ids
    finally:
        subscriber.close()
        publisher.close()
        engine.close()
