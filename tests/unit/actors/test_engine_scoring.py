"""Scoring requests on the torch engine (``score_from``): the log-probability of each given token equals a full
forward pass of the model at temperature 1, whatever the prefix cache, the chunking, the preemptions, the MTP layer
or the requests beside it; nothing is sampled; the scored prefix is cached for the next request; bad requests are
refused."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from forge.actors.backend import FinishReason, GenerationRequest, InvalidRequest
from forge.model import CausalLM
from forge.sampling.params import SamplingParams

from helpers.engines import CONFIG, engine_for, make_model, moe_model


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model(0)


def score(engine, ids: list[int], score_from: int, request_id: str = ""):
    chunks = list(engine.submit(GenerationRequest(request_id, ids, SamplingParams(temperature=0.3, top_k=2),
                                                  score_from=score_from)))
    tokens = [t for c in chunks for t in c.token_ids]
    logprobs = [v for c in chunks for v in c.logprobs]
    versions = [v for c in chunks for v in c.weight_versions]
    return tokens, logprobs, versions, chunks[-1]


def reference(model: CausalLM, ids: list[int], score_from: int) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= score_from, from one forward pass over the whole sequence."""
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([ids])))[0].float()
    chosen = torch.log_softmax(logits[score_from - 1:-1], dim=-1).gather(-1, torch.tensor(ids[score_from:])[:, None])
    return chosen[:, 0].tolist()


@pytest.mark.parametrize("speculative", [False, True])
def test_scores_equal_a_full_forward_pass_with_prefix_hits_and_chunks(model, speculative):
    rng = random.Random(3)
    engine = engine_for(model, speculative=speculative, max_num_batched_tokens=16)
    try:
        prompt = [rng.randrange(100) for _ in range(21)]
        completion = [rng.randrange(100) for _ in range(30)]
        ids = prompt + completion
        tokens, logprobs, versions, last = score(engine, ids, len(prompt))
        assert tokens == completion and versions == [0] * len(completion)
        assert last.finish_reason is FinishReason.STOP
        assert logprobs == pytest.approx(reference(model, ids, len(prompt)), abs=1e-5)
        # the next turn extends the scored sequence: its prefix comes from the cache, scores are unchanged
        longer = ids + [rng.randrange(100) for _ in range(9)]
        tokens, logprobs, _, last = score(engine, longer, len(ids))
        assert last.cached_prompt_tokens >= 48 and len(tokens) == 9
        assert logprobs == pytest.approx(reference(model, longer, len(ids)), abs=1e-5)
        # scoring from inside a cached prefix recomputes what it needs
        _, logprobs, _, _ = score(engine, longer, 3)
        assert logprobs == pytest.approx(reference(model, longer, 3), abs=1e-5)
        assert engine.stats()["scored_tokens"] == 30 + 9 + len(longer) - 3
        assert engine.stats()["tokens"] == 0            # nothing sampled
    finally:
        engine.close()


def test_a_model_with_experts_scores_as_its_forward_pass():
    experts = moe_model()
    engine = engine_for(experts, max_num_batched_tokens=16)
    try:
        ids = list(range(3, 40))
        _, logprobs, _, last = score(engine, ids, 9)
        assert logprobs == pytest.approx(reference(experts, ids, 9), abs=1e-5)
        assert last.routed_experts is not None          # the routing of the positions it fed, as a generation's
    finally:
        engine.close()


def test_scoring_beside_generation_and_under_preemption_is_exact(model):
    rng = random.Random(4)
    sequences = [[rng.randrange(100) for _ in range(rng.randrange(20, 60))] for _ in range(6)]
    per_block = 2 * CONFIG.num_layers_with_mtp * 8 * CONFIG.num_key_value_heads * CONFIG.head_dim * 4
    tight = engine_for(model, kv_cache_bytes=14 * per_block, max_num_batched_tokens=16)
    results: dict[int, list[float]] = {}
    generated: dict[int, list[int]] = {}

    def scoring(i: int) -> None:
        results[i] = score(tight, sequences[i], 5, f"score-{i}")[1]

    def generating(i: int) -> None:
        params = SamplingParams(temperature=0.9, seed=i, max_tokens=50, ignore_eos=True)
        generated[i] = [t for c in tight.submit(GenerationRequest(f"gen-{i}", sequences[i][:10], params))
                        for t in c.token_ids]

    threads = [threading.Thread(target=generating, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=scoring, args=(i,)) for i in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert tight.stats()["preemptions"] > 0
    finally:
        tight.close()
    for i, ids in enumerate(sequences):
        assert results[i] == pytest.approx(reference(model, ids, 5), abs=1e-5)
    assert sorted(generated) == [0, 1, 2] and all(len(tokens) == 50 for tokens in generated.values())


def test_bad_scoring_requests_are_refused(model):
    engine = engine_for(model)
    try:
        for ids, score_from, why in (([1, 2, 3], 3, "nothing to score"), ([1, 2, 3], 7, "nothing to score")):
            with pytest.raises(InvalidRequest, match=why):
                engine.submit(GenerationRequest("", ids, SamplingParams(), score_from=score_from))
        with pytest.raises(InvalidRequest, match="served whole"):
            engine.submit(GenerationRequest("", [1, 2, 3], SamplingParams(), prefill_only=True, score_from=1))
    finally:
        engine.close()


def test_an_actor_whose_backend_does_not_score_refuses_scoring_requests(model):
    from forge.actors.engine.engine import TorchEngine
    from forge.actors.servicer import ActorServicer
    from forge.v1 import actor_pb2

    class Sampler(TorchEngine):        # a backend that samples but does not score (vLLM's, TensorRT-LLM's)
        name = "vllm"
        scores = False

    scoring = actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3], score_from=1)
    for backend, refused in ((engine_for(model), None), (Sampler(model), "the vllm backend does not score")):
        try:
            servicer = ActorServicer(backend, "actor-0")
            refusal = servicer._role_refusal(scoring)
            assert refusal is None if refused is None else refused in refusal
            assert servicer._role_refusal(actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3])) is None
        finally:
            backend.close()
