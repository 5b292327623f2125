"""The vLLM backend against the torch engine, transformers and the learner's recomputation, on the same checkpoints:
greedy tokens, sampled tokens' log-probabilities (with temperature, truncation and every edit of the logits: min_tokens,
logit_bias, penalties, structured output), weight versions swapped in process (a LoRA adapter version, then a full
swap) and KV events in Forge's hash chain. One vLLM engine on the tiny checkpoint serves every test that takes the
``tiny`` fixture; those that change its weights come last, in file order. Needs vLLM (``make test-vllm``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from forge.actors.backend import FinishReason, GenerationRequest, InvalidRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.checkpoints import load_model, resolve_model
from forge.checkpoints.random_qwen3 import write_qwen3
from forge.kvhash import chain_hashes, kv_salt
from forge.model import CausalLM
from forge.sampling.grammar import Grammar, Grammars
from forge.sampling.logit_edits import LogitEdits, call_edits
from forge.sampling.params import SamplingParams
from forge.sampling.sampling import batched_sampling_logprobs, sampling_logprobs
from forge.tokenizer.tokenizer import Tokenizer

from helpers.lora import randomize_adapters
from helpers.random_model import random_tiny
from helpers.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[(7 * i + 3 * j) % 900 + 2 for j in range(5 + i % 7)] for i in range(16)]
KV = 64 * 2**20


def run(backend, prompts, params: SamplingParams) -> list[tuple[list[int], list[float], list[int]]]:
    streams = [backend.submit(GenerationRequest("", p, params)) for p in prompts]
    results = []
    for stream in streams:
        chunks = list(stream)
        results.append(([t for c in chunks for t in c.token_ids], [x for c in chunks for x in c.logprobs],
                        [v for c in chunks for v in c.weight_versions]))
    return results


def hf_greedy(directory: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Transformers' greedy continuation of each of ``prompts`` (one at a time, the model loaded once)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    continuations = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            continuations.append(out[0, len(prompt):].tolist())
    return continuations


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """vLLM and the torch engine on one random-weight tiny checkpoint (tied embedding, an MTP head vLLM skips)."""
    from forge.actors.vllm.backend import VllmBackend

    directory = random_tiny(tmp_path_factory.mktemp("tiny"))
    backend = VllmBackend(resolve_model(directory), EngineConfig(kv_cache_bytes=KV, threads=1))
    yield backend, directory
    backend.close()


def torch_engine(directory: Path) -> TorchEngine:
    return TorchEngine(load_model(directory)[0], EngineConfig(kv_cache_bytes=KV))


def vllm_and_torch_engine(directory: Path, params: SamplingParams, threads: int = 1) -> tuple[list, list]:
    """``run`` of PROMPTS on a fresh vLLM backend over ``directory``, then on the torch engine."""
    from forge.actors.vllm.backend import VllmBackend

    backend = VllmBackend(resolve_model(directory), EngineConfig(kv_cache_bytes=KV, threads=threads))
    try:
        ours = run(backend, PROMPTS, params)
    finally:
        backend.close()
    engine = torch_engine(directory)
    try:
        return ours, run(engine, PROMPTS, params)
    finally:
        engine.close()


def test_greedy_tokens_equal_the_torch_engine_and_transformers_on_the_tiny_model(tiny):
    backend, directory = tiny
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = torch_engine(directory)
    try:
        ours, theirs = run(backend, PROMPTS, greedy), run(engine, PROMPTS, greedy)
    finally:
        engine.close()
    for (tokens, logprobs, versions), (want, want_logprobs, _) in zip(ours, theirs, strict=True):
        assert tokens == want and versions == [0] * 12
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-4, rtol=0)
    for (tokens, _, _), want in zip(ours[:4], hf_greedy(directory, PROMPTS[:4], 12), strict=True):
        assert tokens == want


def test_greedy_tokens_equal_on_a_100m_qwen3_written_by_transformers(tmp_path):
    directory = write_qwen3(tmp_path / "q100m", "100m", seed=1)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ours, theirs = vllm_and_torch_engine(directory, greedy, threads=2)
    assert [o[0] for o in ours] == [t[0] for t in theirs]
    for (tokens, _, _), want in zip(ours[:2], hf_greedy(directory, PROMPTS[:2], 8), strict=True):
        assert tokens == want


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=11, max_tokens=16, ignore_eos=True),
                                    SamplingParams(temperature=0.7, top_k=20, seed=12, max_tokens=16, ignore_eos=True),
                                    SamplingParams(temperature=1.2, top_p=0.8, seed=13, max_tokens=16, ignore_eos=True),
                                    SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=14, max_tokens=16,
                                                   ignore_eos=True)])
def test_sampled_logprobs_equal_the_learners_recomputation(tiny, params):
    backend, directory = tiny
    model = CausalLM.from_pretrained(directory).eval()
    for prompt, (tokens, logprobs, _) in zip(PROMPTS[:6], run(backend, PROMPTS[:6], params), strict=True):
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logits = model.logits(model(ids))[0, len(prompt) - 1:-1]
        expected = sampling_logprobs(logits, params.temperature, params.top_k, params.top_p)
        recomputed = expected.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        assert torch.isfinite(recomputed).all(), "a sampled token outside the distribution the learner recomputes"
        torch.testing.assert_close(torch.tensor(logprobs), recomputed, atol=1e-4, rtol=0)


def test_the_same_seed_gives_the_same_tokens(tiny):
    backend, _ = tiny
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    assert run(backend, PROMPTS[:3], params) == run(backend, PROMPTS[:3], params)


def test_end_of_sequence_and_stop_ids_end_a_request_with_the_stop_token(tiny):
    backend, _ = tiny
    tokens = run(backend, [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0][0]
    stop = tokens[5]
    stopped = list(backend.submit(GenerationRequest("", PROMPTS[0], SamplingParams(
        temperature=0, max_tokens=12, stop_token_ids=(stop,)))))
    got = [t for c in stopped for t in c.token_ids]
    assert got == tokens[:tokens.index(stop) + 1] and stopped[-1].finish_reason == "stop"


def learner_logprobs(model: CausalLM, prompt: list[int], tokens: list[int], params: SamplingParams,
                     grammars: Grammars | None = None, edited: bool = True) -> torch.Tensor:
    """The distribution [len(tokens), V] the learner recomputes for ``tokens`` sampled after ``prompt``: the call's
    edits (min_tokens, grammar, logit_bias, penalties) rebuilt from its parameters, prompt and completion by the
    learner's own code (``call_edits``, ``LogitEdits``), then temperature, top-k and top-p
    (``batched_sampling_logprobs``). ``edited=False``: the same without the edits."""
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([prompt + tokens])))[0, len(prompt) - 1:-1]
    edits = call_edits(params, prompt, model.config.eos_token_ids, grammars) if edited else None
    rows = len(tokens)
    return batched_sampling_logprobs(logits, torch.full((rows,), float(params.temperature)),
                                     torch.full((rows,), params.top_k), torch.full((rows,), float(params.top_p)),
                                     edits=None if edits is None else LogitEdits.of_rows(edits.rows(tokens)))


def seeded(params: SamplingParams, index: int) -> SamplingParams:
    """``params`` with a seed of its own for the ``index``-th call (greedy calls unchanged)."""
    return params if params.seed is None else replace(params, seed=params.seed + 100 * index)


def run_seeded(backend, prompts, params: SamplingParams) -> list[tuple[list[int], list[float], list[int]]]:
    """``run`` with a seed of its own for each prompt, so that the calls sample differently."""
    return [run(backend, [prompt], seeded(params, i))[0] for i, prompt in enumerate(prompts)]


def picked(distribution: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    return distribution.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_min_tokens_bans_the_stop_ids_as_the_torch_engine_and_the_learner_do(tiny):
    backend, directory = tiny
    model = CausalLM.from_pretrained(directory).eval()
    free = run(backend, PROMPTS[:4], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    engine = torch_engine(directory)
    try:
        for prompt, (first, _, _) in zip(PROMPTS[:4], free, strict=True):
            stops = tuple(dict.fromkeys(first[:3]))       # greedy decoding would stop on its first token
            for params in (SamplingParams(temperature=0, max_tokens=12, stop_token_ids=stops, min_tokens=6),
                           SamplingParams(temperature=1.0, top_k=30, seed=3, max_tokens=12, stop_token_ids=stops,
                                          min_tokens=6, ignore_eos=True)):
                (tokens, logprobs, _), = run(backend, [prompt], params)
                assert len(tokens) >= 6 and not set(tokens[:6]) & set(stops)
                expected = picked(learner_logprobs(model, prompt, tokens, params), tokens)
                torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-5, rtol=0)
                if params.greedy:
                    assert tokens == run(engine, [prompt], params)[0][0]
    finally:
        engine.close()


BIAS = ((7, 2.5), (40, -3.0), (300, 4.0), (512, 1.5), (901, 3.0))
EDITED = {
    "logit_bias": SamplingParams(temperature=1.0, seed=21, max_tokens=16, ignore_eos=True, logit_bias=BIAS),
    "logit_bias/greedy": SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logit_bias=BIAS),
    "frequency+presence": SamplingParams(temperature=0.8, top_k=40, seed=22, max_tokens=24, ignore_eos=True,
                                         frequency_penalty=1.5, presence_penalty=0.7),
    "frequency+presence/greedy": SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=0.6,
                                                presence_penalty=-0.4),
    "repetition": SamplingParams(temperature=1.0, top_p=0.9, seed=23, max_tokens=24, ignore_eos=True,
                                 repetition_penalty=1.8),
    "repetition/greedy": SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=0.5),
    "all": SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=24, max_tokens=24, ignore_eos=True,
                          min_tokens=4, stop_token_ids=(7,), logit_bias=BIAS, repetition_penalty=1.5,
                          frequency_penalty=0.9, presence_penalty=0.4),
}


@pytest.mark.parametrize("params", list(EDITED.values()), ids=list(EDITED))
def test_logit_bias_and_penalties_are_in_the_recorded_logprobs_as_the_learner_replays_them(tiny, params):
    """vLLM's processed log-probs include logit_bias, the repetition penalty (prompt and output tokens) and the
    frequency and presence penalties (output tokens), in the order the learner rebuilds them; greedy, it picks the
    tokens the torch engine picks with the same edits. Without the edits the recomputation differs."""
    backend, directory = tiny
    model = CausalLM.from_pretrained(directory).eval()
    ours = run_seeded(backend, PROMPTS[:6], params)
    gap = 0.0
    for prompt, (tokens, logprobs, _) in zip(PROMPTS[:6], ours, strict=True):
        expected = picked(learner_logprobs(model, prompt, tokens, params), tokens)
        assert torch.isfinite(expected).all(), "a sampled token outside the distribution the learner recomputes"
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-5, rtol=0)
        unedited = picked(learner_logprobs(model, prompt, tokens, params, edited=False), tokens)
        gap = max(gap, float((torch.tensor(logprobs) - unedited).abs().max()))
    assert gap > 1e-2, f"the edits move no recorded log-prob (by {gap:.2g} at most): nothing is tested"
    if params.greedy:
        engine = torch_engine(directory)
        try:
            assert [o[0] for o in ours] == [t[0] for t in run(engine, PROMPTS[:6], params)]
        finally:
            engine.close()


COLOURS = ("red", "green", "blue")
SCHEMA = json.dumps({"type": "object", "properties": {"colour": {"enum": list(COLOURS)}, "ok": {"type": "boolean"}},
                     "required": ["colour", "ok"], "additionalProperties": False})
STRUCTURED = {
    "greedy": SamplingParams(temperature=0, max_tokens=48, grammar=Grammar("json_schema", SCHEMA)),
    "sampled": SamplingParams(temperature=1.0, seed=31, max_tokens=48, grammar=Grammar("json_schema", SCHEMA)),
    "sampled+edits": SamplingParams(temperature=0.7, top_k=20, seed=32, max_tokens=48,
                                    grammar=Grammar("json_schema", SCHEMA),
                                    logit_bias=BIAS, repetition_penalty=1.3, frequency_penalty=0.5,
                                    presence_penalty=0.5),
}


@pytest.mark.parametrize("params", list(STRUCTURED.values()), ids=list(STRUCTURED))
def test_structured_output_masks_as_the_learners_grammar_replay(tiny, params):
    """A JSON schema is masked by vLLM's guidance backend as Forge's grammar masks it: the completions are documents
    of the schema ended by the end of sequence, their recorded log-probs equal the learner's recomputation with the
    grammar replayed over them (and differ without it), and greedy, they are the torch engine's."""
    backend, directory = tiny
    model = CausalLM.from_pretrained(directory).eval()
    config = model.config
    grammars = Grammars(directory, config.vocab_size, tuple(config.eos_token_ids))
    tokenizer = Tokenizer.from_dir(directory)
    prompts = PROMPTS[:8]
    calls = [(p, seeded(params, i)) for i, p in enumerate(prompts)]
    outputs = [list(backend.submit(GenerationRequest("", p, call))) for p, call in calls]
    completions, documents = [], []
    gap = 0.0
    for (prompt, call), chunks in zip(calls, outputs, strict=True):
        tokens = [t for c in chunks for t in c.token_ids]
        logprobs = torch.tensor([x for c in chunks for x in c.logprobs])
        completions.append(tokens)
        assert chunks[-1].finish_reason == "stop" and tokens[-1] in config.eos_token_ids, tokenizer.decode(tokens)
        document = json.loads(tokenizer.decode(tokens[:-1]))
        assert set(document) == {"colour", "ok"} and document["colour"] in COLOURS
        assert isinstance(document["ok"], bool)
        documents.append(document)
        expected = picked(learner_logprobs(model, prompt, tokens, call, grammars), tokens)
        torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
        unedited = picked(learner_logprobs(model, prompt, tokens, call, edited=False), tokens)
        gap = max(gap, float((logprobs - unedited).abs().max()))
    assert gap > 1.0, f"the grammar moves no recorded log-prob (by {gap:.2g} at most): nothing is tested"
    if not params.greedy:
        assert len({d["colour"] for d in documents}) > 1, f"every sampled document chose the same: {documents}"
    else:
        engine = TorchEngine(load_model(directory)[0], EngineConfig(kv_cache_bytes=KV), grammars=grammars)
        try:
            assert completions == [t[0] for t in run(engine, prompts, params)]
        finally:
            engine.close()


def test_a_schema_that_cannot_compile_is_an_invalid_request(tiny):
    backend, _ = tiny
    with pytest.raises(InvalidRequest, match="JSON schema"):
        backend.submit(GenerationRequest("", PROMPTS[0],
                                         SamplingParams(max_tokens=4, grammar=Grammar("json_schema", '{"type": 7}'))))


def test_structured_output_is_served_only_where_vllms_grammars_mask_as_forges(tmp_path):
    """vLLM loads the checkpoint's tokenizer (and serves structured output) only where its guidance backend masks as
    Forge's grammars do: the tiny model; not a checkpoint without tokenizer.json, nor one whose end-of-sequence id is
    not the tokenizer's (llguidance would end a document with the tokenizer's alone)."""
    from forge.actors.vllm.checkpoint import structured_output_problem

    tiny = random_tiny(tmp_path)
    assert structured_output_problem(tiny, 1024, (1017,)) is None
    assert "end-of-sequence" in structured_output_problem(tiny, 1024, (1017, 1015))
    assert "more than the model's vocabulary" in structured_output_problem(tiny, 1000, (1017,))
    (tmp_path / "bare").mkdir()
    assert "tokenizer.json" in structured_output_problem(tmp_path / "bare", 1024, (1017,))


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, top_logprobs=5),
                                    SamplingParams(temperature=0.8, top_k=8, seed=4, max_tokens=10, ignore_eos=True,
                                                   top_logprobs=20)])
def test_top_logprobs_equal_the_torch_engines_and_the_learners(tiny, params):
    backend, directory = tiny
    model = CausalLM.from_pretrained(directory).eval()
    engine = torch_engine(directory)
    try:
        for prompt in PROMPTS[:3]:
            ours = list(backend.submit(GenerationRequest("", prompt, params)))
            tokens = [t for c in ours for t in c.token_ids]
            tops = [top for c in ours for top in c.top_logprobs]
            assert len(tops) == len(tokens) == 10
            expected = learner_logprobs(model, prompt, tokens, params)
            for i, (ids, values) in enumerate(tops):
                want = torch.topk(expected[i], params.top_logprobs)
                support = int(torch.isfinite(want.values).sum())
                assert len(ids) == support and set(ids) == set(want.indices[:support].tolist())
                torch.testing.assert_close(torch.tensor(values), want.values[:support], atol=1e-4, rtol=0)
            if params.greedy:
                theirs = list(engine.submit(GenerationRequest("", prompt, params)))
                assert [top[0] for c in theirs for top in c.top_logprobs] == [ids for ids, _ in tops]
    finally:
        engine.close()


def test_scoring_requests_give_the_torch_engines_scores(tiny):
    """A teacher's actor may be vLLM: its scores of given tokens (prompt log-probs, temperature 1) are the torch
    engine's and a forward pass's, whatever the request's own sampling parameters."""
    backend, directory = tiny
    model = CausalLM.from_pretrained(directory).eval()
    engine = torch_engine(directory)
    try:
        for prompt in PROMPTS[:3]:
            ids = prompt + [(7 * i + 3) % 200 + 5 for i in range(12)]
            request = GenerationRequest("", ids, SamplingParams(temperature=0.3, top_k=4), score_from=len(prompt))
            ours = list(backend.submit(request))
            theirs = list(engine.submit(request))
            assert ours[-1].finish_reason == theirs[-1].finish_reason == FinishReason.STOP
            assert [t for c in ours for t in c.token_ids] == ids[len(prompt):]
            scores = [v for c in ours for v in c.logprobs]
            with torch.no_grad():
                logits = model.logits(model(torch.tensor([ids])))[0].float()
            forward = torch.log_softmax(logits[len(prompt) - 1:-1], -1).gather(
                -1, torch.tensor(ids[len(prompt):])[:, None])[:, 0].tolist()
            assert scores == pytest.approx(forward, abs=1e-4)
            assert scores == pytest.approx([v for c in theirs for v in c.logprobs], abs=1e-4)
    finally:
        engine.close()


# The tests below change the shared engine's weights (a LoRA adapter version, then a full swap): they come last, in
# this order, so that every test above samples the checkpoint's weights at version 0.


def test_a_lora_adapter_version_serves_what_the_torch_engine_serves_with_it(tiny):
    """An adapter version (the learner's lora_publish = "adapters") merged onto vLLM's checkpoint and onto the torch
    engine's: the same tokens and log-probs, stamped with its version."""
    from forge.learner.lora import LoraConfig, adapter_version, add_adapters

    backend, directory = tiny
    lora = LoraConfig(rank=4, alpha=8.0, publish="adapters")
    adapted = randomize_adapters(add_adapters(load_model(directory)[0], lora), seed=2)
    version = adapter_version(adapted.state_dict(), lora)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = torch_engine(directory)
    try:
        before = run(backend, PROMPTS[:4], greedy)
        backend.load_weights(1, version)
        engine.load_weights(1, version)
        assert engine.wait_for_version(1, timeout=60)
        ours, theirs = run(backend, PROMPTS[:4], greedy), run(engine, PROMPTS[:4], greedy)
    finally:
        engine.close()
    assert [o[0] for o in ours] == [t[0] for t in theirs] != [b[0] for b in before]
    assert all(set(o[2]) == {1} for o in ours)
    for (_, logprobs, _), (_, want, _) in zip(ours, theirs, strict=True):
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want), atol=1e-4, rtol=0)


def test_a_weight_swap_stamps_later_tokens_and_matches_the_torch_engine_on_the_new_weights(tiny):
    backend, directory = tiny
    original = CausalLM.from_pretrained(directory).state_dict()
    new = {name: tensor * (1.0 + 0.05 * (i % 3)) for i, (name, tensor) in enumerate(original.items())}
    long_run = backend.submit(GenerationRequest("", PROMPTS[1], SamplingParams(temperature=0, max_tokens=400,
                                                                                ignore_eos=True)))
    first = long_run.get(timeout=120)
    backend.load_weights(backend.weight_version + 1, new)
    version = backend.weight_version
    rest = list(long_run)
    versions = [v for c in [first, *rest] for v in c.weight_versions]
    assert versions[0] == version - 1 and versions[-1] == version and versions == sorted(versions)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = TorchEngine(load_model(directory)[0], EngineConfig(kv_cache_bytes=KV))
    try:
        engine.load_weights(1, new)
        assert engine.wait_for_version(1, timeout=60)
        ours, theirs = run(backend, PROMPTS[:8], greedy), run(engine, PROMPTS[:8], greedy)
    finally:
        engine.close()
    assert [o[0] for o in ours] == [t[0] for t in theirs]
    assert all(set(o[2]) == {version} for o in ours)
    for (_, logprobs, _), (_, want, _) in zip(ours, theirs, strict=True):
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="not newer"):
        backend.load_weights(version, new)
    with pytest.raises(ValueError, match="does not fit"):
        backend.load_weights(version + 1, {**new, "model.norm.weight": torch.ones(3)})
    assert backend.stats()["weight_swap_ms"] > 0


def test_kv_events_name_the_prompt_blocks_in_forges_hash_chain(tiny):
    backend, _ = tiny
    size = backend.block_size
    prompt = [(11 * j) % 700 + 5 for j in range(3 * size + 5)]
    run(backend, [prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    wanted = chain_hashes(prompt, size, kv_salt(backend.model_id, backend.weight_version))
    log, describe = backend.kv_events()
    wait_for(lambda: set(wanted) <= set(log.poll("", 0).events[0].block_hashes),
             "vLLM's stored blocks to reach the event log")
    layout, figures = describe()
    assert layout.block_size == size and layout.weight_version == backend.weight_version
    assert {"running", "waiting", "kv_used_frac", "tokens_per_s"} <= set(figures)
    again = backend.submit(GenerationRequest("", prompt, SamplingParams(temperature=0, max_tokens=1)))
    assert next(iter(again)).cached_prompt_tokens >= 3 * size
