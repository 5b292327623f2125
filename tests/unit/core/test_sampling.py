"""Sampling: truncation and temperature produce the intended distribution, recorded log-probs are those of the
distribution sampled from, and the reference decoder matches transformers' greedy generation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forge.model.generate import generate
from forge.sampling.logit_edits import LogitEdits, RowEdit
from forge.sampling.params import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingError, SamplingParams
from forge.sampling.sampling import batched_sampling_logprobs, sample, sampling_logprobs, top_logprobs

from helpers.random_model import random_model, small_config


def test_top_k_and_top_p_support():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    probs = sampling_logprobs(logits, 1.0, top_k=2).exp()[0]
    torch.testing.assert_close(probs, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]))
    probs = sampling_logprobs(logits, 1.0, top_p=0.8).exp()[0]   # 0.5 + 0.2 < 0.8 -> keep three tokens
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    probs = sampling_logprobs(logits, 1.0, top_p=0.7).exp()[0]   # 0.5 + 0.2 reaches 0.7 exactly
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)


def test_temperature_scales_logits():
    logits = torch.randn(3, 11)
    torch.testing.assert_close(sampling_logprobs(logits, 0.5), torch.log_softmax(logits / 0.5, -1))
    torch.testing.assert_close(sampling_logprobs(logits, 0.0), torch.log_softmax(logits, -1))


def test_samples_follow_the_distribution_and_log_probs_match():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1])).expand(20_000, 3)
    logprobs = sampling_logprobs(logits, 1.0)
    tokens, recorded = sample(logprobs, greedy=False, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / len(tokens)
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.015, rtol=0)
    torch.testing.assert_close(recorded, logprobs.gather(-1, tokens[:, None])[:, 0])


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(temperature=1e-39), dict(temperature=0.009),
                                    dict(temperature=101), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                    dict(max_tokens=0), dict(seed=-1), dict(min_tokens=-1),
                                    dict(min_tokens=5, max_tokens=4), dict(top_logprobs=21),
                                    dict(top_logprobs=-1)])
def test_bad_sampling_values_are_refused(kwargs):
    with pytest.raises(SamplingError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1.0, MAX_TEMPERATURE])
def test_every_temperature_allowed_gives_finite_logprobs_for_the_sampled_token(temperature):
    """The actor must never record a non-finite log-probability: at the smallest temperature allowed, logits of
    the largest magnitude fp32 models produce still give a finite log-softmax."""
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)) * 1e4
    tokens, recorded = sample(sampling_logprobs(logits, temperature), greedy=False,
                              generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(recorded).all() and (tokens >= 0).all()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    config = small_config(vocab_size=89, intermediate_size=96, num_nextn_predict_layers=0, eos_token_id=88)
    net = random_model(config, seed=4, std=0.2)
    path = tmp_path_factory.mktemp("model")
    net.save_pretrained(path)
    return net.eval(), path


def test_greedy_generation_matches_transformers(model):
    transformers = pytest.importorskip("transformers")
    net, path = model
    reference = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = [5, 17, 33, 2, 60, 61]
    ours = generate(net, prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    ids = torch.tensor([prompt])
    expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert ours.token_ids == expected
    assert ours.finish_reason == "length"


def test_recorded_log_probs_equal_a_full_forward_pass(model):
    net, _ = model
    prompt = [1, 2, 3, 4]
    out = generate(net, prompt, SamplingParams(temperature=0.7, top_k=20, seed=11, max_tokens=16, ignore_eos=True))
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = net.logits(net(ids))[0, len(prompt) - 1:-1]
    expected = sampling_logprobs(logits, 0.7, top_k=20).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)
    assert all(math.isfinite(x) for x in out.logprobs)


def test_seed_makes_sampling_reproducible(model):
    net, _ = model
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    assert generate(net, [3, 4], params).token_ids == generate(net, [3, 4], params).token_ids


def test_batched_logprobs_with_host_flags_equal_the_device_check():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 50, generator=generator)
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.5])
    for top_k, top_p in ((torch.tensor([0, 5, 0, 0, 60, 0]), torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0, 0.5])),
                         (torch.zeros(6, dtype=torch.long), torch.ones(6)),
                         (torch.tensor([0, 0, 7, 0, 0, 0]), torch.ones(6))):
        reference = batched_sampling_logprobs(logits, temperature, top_k, top_p)
        flags = (bool((top_k > 0).any()), bool((top_p < 1).any()))
        assert torch.equal(batched_sampling_logprobs(logits, temperature, top_k, top_p, flags), reference)
        for row in range(6):
            expected = sampling_logprobs(logits[row:row + 1], float(temperature[row]), top_k=int(top_k[row]),
                                         top_p=float(top_p[row]))
            torch.testing.assert_close(reference[row:row + 1], expected)
    everything = batched_sampling_logprobs(logits, temperature, torch.zeros(6, dtype=torch.long), torch.ones(6),
                                           (True, False))          # a needless sort changes nothing
    assert torch.equal(everything, batched_sampling_logprobs(logits, temperature, torch.zeros(6, dtype=torch.long),
                                                             torch.ones(6)))


def test_banned_tokens_leave_their_rows_distribution_before_truncation():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.5, 0.2, 0.15, 0.1, 0.05]]))
    banned = LogitEdits.of_rows([(0, RowEdit(banned=np.array([0, 3])))])
    probs = batched_sampling_logprobs(logits, torch.tensor([1.0, 1.0]), torch.tensor([2, 2]), torch.tensor([1.0, 1.0]),
                                      edits=banned).exp()
    # Row 0 without tokens 0 and 3: top-2 of what is left is {1, 2}; row 1 untouched: {0, 1}.
    torch.testing.assert_close(probs[0], torch.tensor([0, 0.2, 0.15, 0, 0]) / 0.35)
    torch.testing.assert_close(probs[1], torch.tensor([5 / 7, 2 / 7, 0, 0, 0]))


def test_top_logprobs_leave_out_tokens_outside_the_support():
    logprobs = sampling_logprobs(torch.log(torch.tensor([[0.1, 0.6, 0.3]])), 1.0, top_k=2)
    ids, values = top_logprobs(logprobs, 3)
    assert ids == [[1, 2]] and values[0] == pytest.approx([math.log(2 / 3), math.log(1 / 3)], abs=1e-6)


@pytest.mark.parametrize("uniform", [0.0, 0.5, 1 - 2**-30, 1 - 2**-53])
def test_the_engine_draw_never_picks_a_token_outside_the_support(uniform):
    """Inverse-CDF sampling with a uniform that rounds to 1 in float32 must still land in the support: the last
    tokens of the vocabulary truncated away by top-k (log-probability -inf) are never drawn."""
    from types import SimpleNamespace

    import numpy as np

    from forge.actors.engine.runner import draw

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    logits[:, -5:] = -1e4                       # the lowest logits sit at the end of the vocabulary
    logprobs = batched_sampling_logprobs(logits, torch.ones(4), torch.full((4,), 10), torch.ones(4))
    seqs = [SimpleNamespace(params=SamplingParams(top_k=10)) for _ in range(4)]     # draw reads params only
    tokens = draw(logprobs.exp, np.full(4, uniform), seqs, lambda: logprobs.argmax(-1))
    picked = logprobs.gather(-1, tokens[:, None])[:, 0]
    assert torch.isfinite(picked).all(), (tokens, picked)


def test_the_smallest_temperature_survives_the_float32_of_the_wire():
    """0.01 travels as protobuf float32 (0.0099999998): the gateway's check and the actor both accept it."""
    from forge.sampling.params import temperature_problem
    from forge.sampling.wire import sampling_from_proto
    from forge.v1 import common_pb2

    wire = common_pb2.SamplingParams(temperature=MIN_TEMPERATURE)
    assert wire.temperature < MIN_TEMPERATURE and temperature_problem(wire.temperature) is None
    assert sampling_from_proto(wire).temperature == wire.temperature
    assert temperature_problem(0.0099) is not None
