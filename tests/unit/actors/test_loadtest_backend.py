"""The load-test backend (``--backend loadtest``): it answers with the vocabulary's plain word pieces, by the request's
seed, in messages of the stream interval, up to max tokens or a stop id past min tokens; it takes weight versions
(its tokens carry the last) and refuses what it cannot serve."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from forge.actors.backend import FinishReason, GenerationRequest, InvalidRequest, Overloaded
from forge.actors.config import ActorConfig
from forge.actors.limits import RequestLimits
from forge.actors.loadtest.backend import LoadTestBackend, plain_ids
from forge.actors.loadtest.config import LoadTestConfig
from forge.actors.loadtest.factory import LoadTestFactory
from forge.checkpoints import load_tokenizer
from forge.sampling.grammar import Grammar
from forge.sampling.params import SamplingParams
from forge.settings import build

INSTANT = LoadTestConfig(loadtest_first_token_ms=0, loadtest_prefill_tokens_per_s=0, loadtest_tokens_per_s=0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def plain(tokenizer) -> list[int]:
    return plain_ids(tokenizer)


def run(backend, ids=(5, 6, 7), request_id: str = "", stream_interval: int = 0, **sampling):
    stream = backend.submit(GenerationRequest(request_id, list(ids), SamplingParams(**sampling),
                                              stream_interval=stream_interval))
    return list(stream)


def test_plain_pieces_are_words_without_special_tokens(tokenizer, plain):
    special = set(tokenizer.backend.get_added_tokens_decoder())
    assert len(plain) > 100 and not special & set(plain)
    assert all(re.fullmatch(r" ?[A-Za-z]+", tokenizer.decode([i])) for i in plain)


def test_a_request_gets_max_tokens_of_plain_pieces_drawn_by_its_seed(tokenizer, plain):
    backend = LoadTestBackend(plain, RequestLimits(tokenizer.vocab_size, 4096, 4096, (1,), 8), INSTANT)
    try:
        first = run(backend, max_tokens=40, seed=7)
        ids = [t for c in first for t in c.token_ids]
        assert len(ids) == 40 and set(ids) <= set(plain)
        assert first[-1].finish_reason == FinishReason.LENGTH
        assert [len(c.token_ids) for c in first] == [1] * 40         # one token a message by default
        assert all(-4.0 < lp <= 0 for c in first for lp in c.logprobs)
        assert all(v == 0 for c in first for v in c.weight_versions)
        again = [t for c in run(backend, max_tokens=40, seed=7) for t in c.token_ids]
        other = [t for c in run(backend, max_tokens=40, seed=8) for t in c.token_ids]
        assert again == ids and other != ids
        unseeded = [[t for c in run(backend, max_tokens=20) for t in c.token_ids] for _ in range(2)]
        assert unseeded[0] != unseeded[1]                             # each request id draws its own
    finally:
        backend.close()


def test_messages_follow_the_stream_interval_and_stops_after_min_tokens(tokenizer, plain):
    backend = LoadTestBackend(plain, RequestLimits(tokenizer.vocab_size, 4096, 4096, (1,), 8), INSTANT,
                              stream_interval=3)
    try:
        assert [len(c.token_ids) for c in run(backend, max_tokens=11)] == [1, 3, 3, 3, 1]
        whole = run(backend, max_tokens=11, stream_interval=2**31 - 1)        # the gateway's non-streaming call
        assert [len(c.token_ids) for c in whole] == [1, 10]
        stopped = run(backend, max_tokens=50, min_tokens=4, stop_token_ids=tuple(plain))
        assert sum(len(c.token_ids) for c in stopped) == 5 and stopped[-1].finish_reason == FinishReason.STOP
        top = run(backend, max_tokens=3, top_logprobs=3)
        for chunk in top:
            for token, (ids, logprobs) in zip(chunk.token_ids, chunk.top_logprobs, strict=True):
                assert ids[0] == token and len(ids) == 3 and logprobs == sorted(logprobs, reverse=True)
    finally:
        backend.close()


def test_an_aborted_request_ends_with_abort(tokenizer, plain):
    slow = LoadTestConfig(loadtest_first_token_ms=0, loadtest_prefill_tokens_per_s=0, loadtest_tokens_per_s=1)
    backend = LoadTestBackend(plain, RequestLimits(tokenizer.vocab_size, 4096, 4096, (1,), 8), slow)
    try:
        stream = backend.submit(GenerationRequest("slow", [5, 6], SamplingParams(max_tokens=1000)))
        first = stream.get()
        assert len(first.token_ids) == 1 and first.finish_reason is None
        assert backend.abort("slow") and not backend.abort("slow") and not backend.abort("unknown")
        rest = list(stream)
        assert rest[-1].finish_reason == FinishReason.ABORT
        assert sum(len(c.token_ids) for c in rest) < 999
        assert backend.stats()["running"] == 0 and backend.stats()["aborted"] == 1
    finally:
        backend.close()


def test_weight_versions_are_taken_and_carried(tokenizer, plain):
    backend = LoadTestBackend(plain, RequestLimits(tokenizer.vocab_size, 4096, 4096, (1,), 8), INSTANT,
                              version=-1)
    try:
        backend.load_weights(0, {})
        backend.load_weights(3, {"w": object()})
        assert backend.weight_version == 3
        assert {v for c in run(backend, max_tokens=5) for v in c.weight_versions} == {3}
        with pytest.raises(ValueError, match="not newer"):
            backend.load_weights(2, {})
    finally:
        backend.close()


@pytest.mark.parametrize(("request_", "message"), [
    (GenerationRequest("", [], SamplingParams()), "empty"),
    (GenerationRequest("", [5, 10**6], SamplingParams()), "outside the vocabulary"),
    (GenerationRequest("", [5] * 5000, SamplingParams()), "context"),
    (GenerationRequest("", [5, 6], SamplingParams(grammar=Grammar("json_schema", "{}"))), "grammar"),
    (GenerationRequest("", [5, 6, 7], SamplingParams(), score_from=1), "scores nothing"),
    (GenerationRequest("", [5, 6], SamplingParams(), prefill_only=True), "disaggregated"),
    (GenerationRequest("", [5, 6], SamplingParams(), adapter="run-a"), "no adapter named"),
])
def test_what_it_cannot_serve_is_refused(tokenizer, plain, request_, message):
    backend = LoadTestBackend(plain, RequestLimits(tokenizer.vocab_size, 4096, 4096, (1,), 8), INSTANT)
    try:
        with pytest.raises(InvalidRequest, match=message):
            backend.submit(request_)
    finally:
        backend.close()


def test_a_full_queue_is_overloaded(tokenizer, plain):
    slow = dataclasses.replace(INSTANT, loadtest_first_token_ms=10**9)
    backend = LoadTestBackend(plain, RequestLimits(tokenizer.vocab_size, 4096, 4096, (1,), 2), slow)
    try:
        streams = [backend.submit(GenerationRequest(f"r{i}", [5], SamplingParams())) for i in range(2)]
        with pytest.raises(Overloaded):
            backend.submit(GenerationRequest("r2", [5], SamplingParams()))
    finally:
        backend.close()
    assert all(list(s)[-1].finish_reason == FinishReason.ABORT for s in streams)       # closing ends them


def test_the_factory_reads_the_models_context_and_queue(tmp_path):
    from forge.actors.backend import StartContext
    from forge.checkpoints import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path / "tiny")
    settings = json.loads((directory / "config.json").read_text())
    config = build(ActorConfig, {"model": str(directory), "backend": "loadtest", "max_waiting": 100,
                                 "loadtest_tokens_per_s": 0.0})
    serving = LoadTestFactory().build(config, StartContext(device="cpu", threads=0, initial_version=-1))
    try:
        limits = serving.backend.limits
        assert limits.max_positions == settings["max_position_embeddings"]
        assert limits.max_in_flight == config.engine.max_num_seqs + 100
        assert serving.backend.weight_version == -1                 # serves once the learner's first version is in
    finally:
        serving.backend.close()

