"""The Tinker server's sampling through a real forge-actor (``ActorSampling``): sampler weights published at run time
on the actor's adapter source (``--adapter-source``), each sample sent once the actor reports the set that holds its
adapter. Each adapter's samples are the merged model's (per-token log-probs recomputed independently; one adapter
adapts the output head too), the base model's are the base's, the least recently used adapter is evicted past the
actor's capacity and comes back when sampled again, and stop tokens and stop strings cut where they should."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from forge.learner.tinker.actor_generate import stop_cut
from forge.learner.tinker.sampling import ActorSampling
from forge.learner.tinker.types import LoraSpec, ModelInfo, NotFound, SampleParams
from forge.model.qwen3 import CausalLM
from forge.sampling.params import SamplingParams
from forge.v1 import actor_pb2_grpc, common_pb2

from conftest import free_port
from helpers.engines import full_forward_logprobs
from helpers.lora import adapted_run
from helpers.processes import start_actor
from helpers.random_model import random_tiny

PROMPT = [5, 17, 3, 42, 8, 11]
SAMPLED = SampleParams(max_tokens=8, temperature=1.0, seed=11, stop_at_eos=False)


class SamplerWeights:
    """The one part of ``Training`` sampling reads: each sampler path's model and adapter tensors (random
    adapters on the base), and how often each was read."""

    def __init__(self, base_dir, adapters: dict[str, dict]) -> None:
        self.adapters = adapters
        self.info = ModelInfo("model-1", "owner", str(base_dir), LoraSpec(rank=4), str(base_dir), "tiny")
        self.reads: list[str] = []

    def sampler_weights(self, path: str):
        if path not in self.adapters:
            raise NotFound(f"no sampler weights at {path}")
        self.reads.append(path)
        return self.info, self.adapters[path]


def actor_gauges(address: str) -> dict[str, float]:
    with grpc.insecure_channel(address) as channel:
        return dict(actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest(), timeout=30).gauges)


def check_logprobs(model: CausalLM, sequences) -> None:
    for sequence in sequences:
        assert len(sequence.tokens) == 8 and sequence.stop_reason == "length"
        expected = full_forward_logprobs(model, PROMPT, sequence.tokens, SamplingParams(temperature=1.0))
        assert sequence.logprobs == pytest.approx(expected, abs=2e-4)


def with_head(run: tuple[dict, CausalLM], seed: int) -> tuple[dict, CausalLM]:
    """A run whose adapter also adapts the output head (Tinker's train_unembed), and its model: the head's term
    added to the logits as the Tinker learner adds it."""
    version, model = run
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(4, model.config.hidden_size, generator=generator) * 0.3
    b = torch.randn(model.config.vocab_size, 4, generator=generator) * 0.3
    scaling = float(version["lora.scaling"])
    model.head_linear = lambda x, weight: torch.nn.functional.linear(x, weight) + scaling * (x @ a.t()) @ b.t()
    return {**version, "lm_head.lora_A.weight": a, "lm_head.lora_B.weight": b}, model


@pytest.fixture
def setup(tmp_path):
    base_dir = random_tiny(tmp_path)
    base = CausalLM.from_pretrained(base_dir)
    runs = {f"tinker://model-1/sampler_weights/{name}": adapted_run(base, seed)
            for name, seed in (("a", 1), ("b", 2), ("c", 3))}
    runs["tinker://model-1/sampler_weights/b"] = with_head(runs["tinker://model-1/sampler_weights/b"], 4)
    training = SamplerWeights(base_dir, {path: version for path, (version, _) in runs.items()})
    fetch, announce = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    actor = start_actor(tmp_path, "--model", str(base_dir), "--adapter-source", f"{fetch},{announce}",
                        "--source-adapters", "2")
    sampling = ActorSampling(training, (actor.address,), None, fetch, announce)
    try:
        yield base_dir, base, {path: merged for path, (_, merged) in runs.items()}, training, actor, sampling
    finally:
        asyncio.run(sampling.close())
        assert actor.stop() == 0


def test_each_sampler_path_samples_with_its_adapter_and_an_evicted_one_comes_back(setup):
    _, base, merged, training, actor, sampling = setup
    a, b, c = merged

    async def scenario() -> None:
        plain = await sampling.sample("tiny", None, PROMPT, 2, SAMPLED)
        check_logprobs(base, plain)
        assert plain[0].tokens != plain[1].tokens                  # a seed per sample
        with_a = await sampling.sample("tiny", a, PROMPT, 2, SAMPLED)
        with_b = await sampling.sample("tiny", b, PROMPT, 2, SAMPLED)
        check_logprobs(merged[a], with_a)
        check_logprobs(merged[b], with_b)
        other = full_forward_logprobs(merged[b], PROMPT, with_a[0].tokens, SamplingParams(temperature=1.0))
        assert with_a[0].logprobs != pytest.approx(other, abs=1e-2)           # the adapters can be told apart
        assert actor_gauges(actor.address)["adapter_source_adapters"] == 2

        check_logprobs(merged[c], await sampling.sample("tiny", c, PROMPT, 1, SAMPLED))    # evicts a
        assert set(sampling.published) == {b, c}
        check_logprobs(merged[a], await sampling.sample("tiny", a, PROMPT, 1, SAMPLED))    # a back, b evicted
        assert set(sampling.published) == {c, a}
        assert training.reads == [a, b, c, a]
        gauges = actor_gauges(actor.address)
        assert gauges["adapter_source_adapters"] == 2 and gauges["adapter_source_refused"] == 0
        with pytest.raises(NotFound):
            await sampling.sample("tiny", "tinker://model-1/sampler_weights/none", PROMPT, 1, SAMPLED)

    asyncio.run(scenario())


def test_stop_tokens_and_stop_strings_cut_the_sequence(setup):
    base_dir, _, merged, _, _, sampling = setup
    path = next(iter(merged))
    greedy = SampleParams(max_tokens=8, temperature=0.0, stop_at_eos=False)

    async def scenario() -> None:
        from forge.checkpoints import load_tokenizer

        whole = (await sampling.sample("tiny", path, PROMPT, 1, greedy))[0]
        assert len(whole.tokens) == 8 and whole.stop_reason == "length"
        stop_token = whole.tokens[3]
        by_token = (await sampling.sample("tiny", path, PROMPT, 1,
                                          SampleParams(max_tokens=8, temperature=0.0, stop_tokens=(stop_token,))))[0]
        first = whole.tokens.index(stop_token)
        assert by_token.tokens == whole.tokens[:first + 1] and by_token.stop_reason == "stop"
        assert by_token.logprobs == pytest.approx(whole.logprobs[:first + 1], abs=1e-5)

        decode = load_tokenizer(str(base_dir)).decode
        stop = decode(whole.tokens[2:4])
        assert stop.strip()
        cut = stop_cut(whole.tokens, decode, [stop])
        by_string = (await sampling.sample("tiny", path, PROMPT, 1,
                                           SampleParams(max_tokens=8, temperature=0.0, stop_at_eos=False,
                                                        stop_strings=(stop,))))[0]
        assert by_string.tokens == whole.tokens[:cut] and by_string.stop_reason == "stop" and cut <= 4

    asyncio.run(scenario())
