"""A grammar that compiles and takes its first token but fails later (a rule that only refers to itself after an
opening brace: llguidance answers NoExtensionBias at the second mask) ends its own request with an error; the
requests stepped beside it go on exactly as they would alone."""

from __future__ import annotations

import threading

import pytest

from forge.actors.backend import FinishReason
from forge.actors.engine.engine import EngineConfig, TorchEngine
from forge.actors.engine.policy import grammars_of
from forge.checkpoints import load_model
from forge.sampling.grammar import Grammar
from forge.sampling.params import SamplingParams

from helpers.engines import run

SELF_REFERRING = Grammar("lark", 'start: "{" a\na: b\nb: a')


@pytest.fixture(scope="module")
def engine():
    model, _ref = load_model("tiny")
    engine = TorchEngine(model, EngineConfig(kv_cache_bytes=8 * 2**20, block_size=8, speculative=False),
                         grammars=grammars_of("tiny", model))
    yield engine
    engine.close()


def test_a_grammar_failing_mid_generation_ends_only_its_own_request(engine):
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone, _, _, _ = run(engine, [5, 6, 7], plain)
    outcomes: dict[str, tuple] = {}
    started = threading.Barrier(2)

    def send(name: str, params: SamplingParams) -> None:
        started.wait()
        outcomes[name] = run(engine, [5, 6, 7], params)

    threads = [threading.Thread(target=send, args=("plain", plain)),
               threading.Thread(target=send, args=("failing", SamplingParams(temperature=0, max_tokens=12,
                                                                             grammar=SELF_REFERRING)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    tokens, _, _, last = outcomes["failing"]
    assert last.finish_reason == FinishReason.ERROR and "the grammar failed at output token 1" in last.error
    assert len(tokens) == 1                              # its first token ("{"), then nothing drawn unconstrained
    assert outcomes["plain"][0] == alone and outcomes["plain"][3].finish_reason == FinishReason.LENGTH
    assert run(engine, [5, 6, 7], plain)[0] == alone     # the engine serves on
