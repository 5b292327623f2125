"""The embedded torch engine: exact greedy outputs and log-probs (with prefix hits, chunked prefill, preemption and
MTP speculation), isolation of concurrent requests, abort, streaming, stop tokens, min_tokens and top log-probs.
(Weight swaps, refusals and the engine's figures: test_engine_swaps_and_refusals.py.)"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from collections import Counter

import pytest
import torch

from forge.actors.backend import FinishReason, GenerationRequest
from forge.actors.engine.cpu_kernels import compiler_present
from forge.model import CausalLM
from forge.sampling.params import SamplingParams
from forge.sampling.sampling import sampling_logprobs

from helpers.engines import (
    CONFIG,
    assert_concurrent_greedy_equals,
    assert_logprobs_equal_a_full_forward_pass,
    engine_for,
    full_forward_logprobs,
    make_model,
    run,
    transformers_reference,
)
from helpers.random_model import small_config


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model(0)


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["c-attention", "torch-attention"])
@pytest.mark.parametrize("speculative", [False, True])
def test_greedy_equals_transformers_and_concurrent_requests_stay_isolated(tmp_path, model, speculative, cpu_kernels):
    reference = transformers_reference(tmp_path, model)
    rng = random.Random(1)
    prompts = [[rng.randrange(100) for _ in range(rng.randrange(1, 40))] for _ in range(12)]
    engine = engine_for(model, speculative=speculative, cpu_kernels=cpu_kernels)
    assert (engine.runner.kernel is not None) == (cpu_kernels and compiler_present())
    try:
        assert_concurrent_greedy_equals(engine, reference, prompts, 20)
        if speculative:
            assert engine.stats()["drafts"] > 0
    finally:
        engine.close()


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=3),
                                    SamplingParams(temperature=1.2, top_k=10, top_p=0.9, max_tokens=24, seed=4,
                                                   ignore_eos=True),
                                    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["c-attention", "torch-attention"])
def test_recorded_logprobs_equal_a_full_forward_pass_with_and_without_prefix_hits(model, speculative, params,
                                                                                  cpu_kernels):
    assert_logprobs_equal_a_full_forward_pass(model, params, speculative=speculative, cpu_kernels=cpu_kernels)


def test_prefix_hits_chunked_prefill_and_preemption_do_not_change_outputs(model):
    rng = random.Random(5)
    shared = [rng.randrange(100) for _ in range(30)]
    prompts = [shared + [rng.randrange(100) for _ in range(rng.randrange(1, 20))] for _ in range(8)]
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=40, ignore_eos=True) for i in range(8)]
    roomy = engine_for(model)
    expected = [run(roomy, p, s)[0] for p, s in zip(prompts, params, strict=True)]
    roomy.close()
    # 12 blocks of 8 tokens cannot hold 8 sequences of up to 89 tokens: requests get preempted and recomputed.
    per_block = 2 * CONFIG.num_layers_with_mtp * 8 * CONFIG.num_key_value_heads * CONFIG.head_dim * 4
    tight = engine_for(model, kv_cache_bytes=14 * per_block, max_num_batched_tokens=16)
    try:
        got: dict[int, list[int]] = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, run(tight, prompts[i], params[i])[0]))
                   for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [got[i] for i in range(8)] == expected
        assert tight.stats()["preemptions"] > 0
        assert tight.blocks.num_free == len(tight.blocks.blocks)
    finally:
        tight.close()


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_decode_steps(model, share):
    """A prompt of many chunks arriving while another request decodes: with a prefill share below 1 (the default is
    half) every chunk but the last is followed by decode steps of the other request, which keeps producing tokens;
    with 1, its chunks run back to back. Both requests record the log-probs of a full forward pass either way."""
    engine = engine_for(model, max_num_batched_tokens=32, prefill_share=share)
    steps: list[list[tuple[str, int, int]]] = []
    long_queued = threading.Event()
    real_run = engine.runner.run
    short_prompt = [3, 1, 4, 1, 5]

    def recorded(work):                 # the real runner, its steps written down
        step = [(item.seq.request_id, item.start, item.end) for item in work]
        if any(rid == "short" and start >= len(short_prompt) for rid, start, _ in step):
            long_queued.wait(600)       # the short request decodes no further until the long prompt is queued
        steps.append(step)
        return real_run(work)

    engine.runner.run = recorded
    rng = random.Random(17)
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    long_prompt = [rng.randrange(100) for _ in range(400)]
    try:
        short = engine.submit(GenerationRequest("short", short_prompt, params))
        pending = engine.submit(GenerationRequest("long", long_prompt, SamplingParams(temperature=0, max_tokens=4,
                                                                                    ignore_eos=True)))
        long_queued.set()
        chunks_of_long = list(pending)
        chunks_of_short = list(short)
    finally:
        engine.close()
    long_tokens = [t for c in chunks_of_long for t in c.token_ids]
    long_logprobs = [v for c in chunks_of_long for v in c.logprobs]
    chunks = [i for i, step in enumerate(steps) for rid, start, _ in step if rid == "long" and start < 400]
    assert len(chunks) == math.ceil(400 / 32)
    between = [steps[a + 1:b] for a, b in itertools.pairwise(chunks)]
    if share < 1:       # as many decode steps as fill half the time: at least one, of the short request only
        assert all(gap and all([rid for rid, _, _ in step] == ["short"] for step in gap) for gap in between), between
    else:
        assert all(not gap for gap in between), between
    short_tokens = [t for c in chunks_of_short for t in c.token_ids]
    short_logprobs = [v for c in chunks_of_short for v in c.logprobs]
    assert len(short_tokens) == 120
    greedy = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    assert short_logprobs == pytest.approx(full_forward_logprobs(model, short_prompt, short_tokens, greedy), abs=1e-4)
    assert long_logprobs == pytest.approx(full_forward_logprobs(model, long_prompt, long_tokens, greedy), abs=1e-4)


def test_a_request_arriving_during_a_long_prefill_is_admitted_beside_its_chunks(model):
    """A request arriving while a long prompt is chunked is admitted in the next step with half the budget, beside
    the long prompt's next chunk, rather than after its last; both record the log-probs of a full forward pass."""
    engine = engine_for(model, max_num_batched_tokens=32, prefill_share=1.0)
    steps: list[list[tuple[str, int, int]]] = []
    second_chunk, late_queued = threading.Event(), threading.Event()
    real_run = engine.runner.run

    def recorded(work):                 # the real runner, its steps written down
        step = [(item.seq.request_id, item.start, item.end) for item in work]
        if any(rid == "long" and 0 < start < 400 for rid, start, _ in step) and not late_queued.is_set():
            second_chunk.set()
            late_queued.wait(600)       # the second chunk waits until the late request is queued
        steps.append(step)
        return real_run(work)

    engine.runner.run = recorded
    rng = random.Random(19)
    long_prompt, late_prompt = [rng.randrange(100) for _ in range(400)], [7, 8, 9, 10, 11, 12]
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    try:
        pending = engine.submit(GenerationRequest("long", long_prompt, greedy))
        assert second_chunk.wait(600)
        late = engine.submit(GenerationRequest("late", late_prompt, greedy))
        late_queued.set()
        chunks_of_long, chunks_of_late = list(pending), list(late)
    finally:
        engine.close()
    long_chunks = [i for i, step in enumerate(steps) for rid, start, _ in step if rid == "long" and start < 400]
    admitted = next(i for i, step in enumerate(steps) for rid, _, _ in step if rid == "late")
    assert long_chunks[1] < admitted < long_chunks[-1], (admitted, long_chunks)
    assert [rid for rid, _, _ in steps[admitted]] == ["late", "long"]          # new requests first, then the chunk
    assert sum(end - start for _, start, end in steps[admitted]) == 32
    for prompt, chunks in ((long_prompt, chunks_of_long), (late_prompt, chunks_of_late)):
        tokens = [t for c in chunks for t in c.token_ids]
        logprobs = [v for c in chunks for v in c.logprobs]
        assert len(tokens) == 3
        assert logprobs == pytest.approx(full_forward_logprobs(model, prompt, tokens, greedy), abs=1e-4)


def test_speculative_sampling_keeps_the_exact_distribution():
    config = small_config(vocab_size=6, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1)
    model = make_model(3, config)
    with torch.no_grad():
        model.mtp[0].fc.weight.mul_(4.0)       # a draft head that disagrees with the policy often
    prompt = [1, 2, 3]
    with torch.no_grad():
        first = model.logits(model(torch.tensor([prompt])))[0, -1].softmax(-1)
        exact = {}
        for a in range(6):
            second = model.logits(model(torch.tensor([[*prompt, a]])))[0, -1].softmax(-1)
            for b in range(6):
                exact[(a, b)] = float(first[a] * second[b])
    engine = engine_for(model, speculative=True, max_waiting=4000)
    samples = 3000
    try:
        streams = [engine.submit(GenerationRequest("", prompt, SamplingParams(seed=i, max_tokens=2, ignore_eos=True)))
                   for i in range(samples)]
        counts = Counter(tuple(t for chunk in stream for t in chunk.token_ids) for stream in streams)
        acceptance = engine.stats()["spec_acceptance"]
    finally:
        engine.close()
    chi2 = sum((counts.get(cell, 0) - samples * p) ** 2 / (samples * p) for cell, p in exact.items())
    assert chi2 < 80.0, f"chi-square {chi2:.1f} over 35 degrees of freedom"   # p < 1e-4 at 80
    assert 0.0 < acceptance < 1.0


def test_seeded_requests_reproduce_whatever_the_batch(model):
    engine = engine_for(model)
    try:
        params = SamplingParams(temperature=1.0, seed=42, max_tokens=16, ignore_eos=True)
        alone = run(engine, [5, 6, 7], params)[0]
        streams = [engine.submit(GenerationRequest("", [5, 6, 7] if i == 3 else [i, 9],
                                                   params if i == 3 else SamplingParams(max_tokens=16)))
                   for i in range(8)]
        crowded = [t for chunk in streams[3] for t in chunk.token_ids]
        for stream in streams:
            list(stream)
        assert crowded == alone
    finally:
        engine.close()


def test_abort_frees_blocks_and_ends_the_stream(model):
    engine = engine_for(model)
    try:
        stream = engine.submit(GenerationRequest("long", list(range(50)), SamplingParams(max_tokens=400,
                                                                                           ignore_eos=True)))
        stream.get(timeout=30)
        assert engine.abort("long")
        chunks = list(stream)
        assert chunks[-1].finish_reason is FinishReason.ABORT
        assert not engine.abort("long")
        engine.submit(GenerationRequest("", [1], SamplingParams(max_tokens=1))).finished.wait(30)
        assert engine.blocks.num_free == len(engine.blocks.blocks)
    finally:
        engine.close()


@pytest.mark.parametrize("interval", [5, 0], ids=["every-5", "adaptive"])
def test_streaming_in_messages_of_several_tokens_loses_nothing(model, interval):
    """Tokens go out in messages of ``interval`` (adaptive: one per token up to 4 running requests, then running // 4),
    the first one alone; whatever is pending ends with the request, including an aborted one."""
    params = SamplingParams(temperature=0.7, max_tokens=23, ignore_eos=True, seed=1)
    prompts = [[random.Random(i).randrange(100) for _ in range(9)] for i in range(12)]
    one_by_one = engine_for(model, stream_interval=1, speculative=False)
    try:
        expected = [run(one_by_one, prompt, params)[0] for prompt in prompts]
    finally:
        one_by_one.close()
    engine = engine_for(model, stream_interval=interval, speculative=False)
    try:
        streams = [engine.submit(GenerationRequest(f"r{i}", prompt, params)) for i, prompt in enumerate(prompts)]
        aborted = engine.submit(GenerationRequest("aborted", prompts[0], SamplingParams(max_tokens=400,
                                                                                        ignore_eos=True)))
        aborted.get(timeout=30)
        time.sleep(0.05)
        engine.abort("aborted")
        for want, stream in zip(expected, streams, strict=True):
            chunks = list(stream)
            tokens = [t for chunk in chunks for t in chunk.token_ids]
            assert len(chunks[0].token_ids) == 1 and chunks[-1].finish_reason is FinishReason.LENGTH
            assert all(len(c.token_ids) == len(c.logprobs) == len(c.weight_versions) for c in chunks)
            assert len(chunks) < len(tokens) and max(len(c.token_ids) for c in chunks) <= (interval or 13 // 4)
            assert tokens == want                  # seeded: the same tokens alone and batched, nothing lost
        whole = list(engine.submit(GenerationRequest("whole", prompts[1], params, stream_interval=2**31 - 1)))
        assert [len(c.token_ids) for c in whole] == [1, 22] and [t for c in whole for t in c.token_ids] == expected[1]
        rest = list(aborted)
        assert rest[-1].finish_reason is FinishReason.ABORT
        assert engine.stats()["tokens"] == 13 * 23 + 1 + sum(len(c.token_ids) for c in rest)
    finally:
        engine.close()


def test_stop_tokens_and_eos_finish_with_stop(model):
    engine = engine_for(model)
    try:
        tokens = run(engine, [3, 4], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
        stop = tokens[5]
        got, _, _, last = run(engine, [3, 4], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(stop,)))
        assert got == tokens[:tokens.index(stop) + 1] and last.finish_reason is FinishReason.STOP
    finally:
        engine.close()


def masked_forward_logprobs(model: CausalLM, prompt: list[int], tokens: list[int], params: SamplingParams,
                            banned: list[int]) -> torch.Tensor:
    """The sampling distribution [len(tokens), V] of every output of ``prompt + tokens``, with ``banned`` ids left
    out of the first ``params.min_tokens`` ones (what the engine draws from)."""
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([prompt + tokens])))[0, len(prompt) - 1:-1].clone()
    logits[:params.min_tokens, banned] = float("-inf")
    return sampling_logprobs(logits, params.temperature, params.top_k, params.top_p)


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_keeps_stop_ids_out_of_the_first_tokens_and_records_their_logprobs(model, speculative,
                                                                                     temperature):
    engine = engine_for(model, speculative=speculative)
    prompt = [3, 4, 5]
    try:
        free = run(engine, prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
        stops = tuple(dict.fromkeys(free[:4]))    # greedy decoding would stop at once on any of these
        params = SamplingParams(temperature=temperature, max_tokens=12, seed=5, stop_token_ids=stops, min_tokens=6)
        for _ in range(3 if temperature else 1):
            tokens, logprobs, _, last = run(engine, prompt, params)
            assert len(tokens) >= 6 and not set(tokens[:6]) & set(stops)
            assert last.finish_reason is (FinishReason.STOP if tokens[-1] in stops else FinishReason.LENGTH)
            expected = masked_forward_logprobs(model, prompt, tokens, params, [*stops, 100])
            picked = expected.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(logprobs), picked, atol=2e-5, rtol=0)
            params = SamplingParams(**{**params.__dict__, "seed": params.seed + 1})
        # Without min_tokens the same request stops on the first token.
        assert len(run(engine, prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=stops))[0]) == 1
    finally:
        engine.close()


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, max_tokens=16, seed=2, ignore_eos=True,
                                                   top_logprobs=5),
                                    SamplingParams(temperature=0.7, top_k=3, max_tokens=16, seed=3, ignore_eos=True,
                                                   top_logprobs=20),
                                    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, top_logprobs=1)])
def test_top_logprobs_are_the_most_likely_tokens_of_the_sampling_distribution(model, speculative, params):
    engine = engine_for(model, speculative=speculative)
    prompt = [random.Random(3).randrange(100) for _ in range(20)]
    try:
        stream = engine.submit(GenerationRequest("", prompt, params))
        chunks = list(stream)
        tokens = [t for c in chunks for t in c.token_ids]
        logprobs = [v for c in chunks for v in c.logprobs]
        tops = [top for c in chunks for top in c.top_logprobs]
        assert len(tops) == len(tokens) == 16
        expected = masked_forward_logprobs(model, prompt, tokens, params, [])
        for i, (token, logprob, (ids, values)) in enumerate(zip(tokens, logprobs, tops, strict=True)):
            want = torch.topk(expected[i], params.top_logprobs)
            support = int((want.values > float("-inf")).sum())
            assert len(ids) == len(values) == support and values == sorted(values, reverse=True)
            torch.testing.assert_close(torch.tensor(values), want.values[:support], atol=2e-5, rtol=0)
            assert set(ids) == set(want.indices[:support].tolist()) or len(set(values)) < len(values)
            assert sum(math.exp(v) for v in values) <= 1 + 1e-5
            if token in ids:
                assert values[ids.index(token)] == pytest.approx(logprob, abs=1e-6)
        if params.greedy:
            assert all(ids[0] == token for token, (ids, _) in zip(tokens, tops, strict=True))
        # A request that asks for none gets none.
        plain = list(engine.submit(GenerationRequest("", prompt, SamplingParams(max_tokens=4))))
        assert not any(c.top_logprobs for c in plain)
    finally:
        engine.close()
