"""Graph mode (``compile_decode``): the torch.compile'd decode step gives transformers' greedy tokens and log-probs
equal to a full forward pass, for batches of many rows and of one, with either attention path, and follows weight
swaps without recompiling."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from torch._dynamo.utils import counters

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.model.generate import generate
from forge.sampling.params import SamplingParams

from helpers.engines import full_forward_logprobs, make_model, run, transformers_reference

pytestmark = pytest.mark.skipif(not torch._dynamo.is_dynamo_supported(), reason="torch.compile is unsupported here")


@pytest.fixture(scope="module", params=[True, False], ids=["c-attention", "torch-attention"])
def engine(request):
    engine = TorchEngine(make_model(0), EngineConfig(kv_cache_bytes=8 * 2**20, block_size=8, speculative=False,
                                                     cpu_kernels=request.param, compile_decode=True))
    yield engine
    engine.close()


def test_compiled_decoding_equals_transformers_for_many_rows_and_one(tmp_path, engine):
    reference = transformers_reference(tmp_path, engine.model)
    rng = random.Random(1)
    prompts = [[rng.randrange(100) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(engine, prompts[i], params)[0]))
               for i in range(len(prompts) - 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    results[len(prompts) - 1] = run(engine, prompts[-1], params)[0]          # alone: a batch of one row
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert results[i] == expected, f"request {i}"
    assert engine.runner.compiled is not None and engine.runner.compiled.warm


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=3),
                                    SamplingParams(temperature=1.2, top_k=10, top_p=0.9, max_tokens=20, seed=4,
                                                   ignore_eos=True)])
def test_compiled_decoding_records_the_log_probs_of_a_full_forward_pass(engine, params):
    prompt = [random.Random(7).randrange(100) for _ in range(45)]
    tokens, logprobs, _, _ = run(engine, prompt, params)
    assert len(tokens) == 20
    expected = full_forward_logprobs(engine.model, prompt, tokens, params)
    torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(expected), atol=2e-5, rtol=0)


def test_compiled_decoding_follows_a_weight_swap(engine):
    original = {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}
    other = make_model(9)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    version = engine.weight_version + 1
    run(engine, [1, 2, 3], params)                         # this engine's graph is built
    graphs = counters["stats"]["unique_graphs"]
    try:
        engine.load_weights(version, other.state_dict())
        assert engine.wait_for_version(version)
        tokens, _, versions, _ = run(engine, [1, 2, 3], params)
        assert tokens == generate(other, [1, 2, 3], params).token_ids and set(versions) == {version}
        assert counters["stats"]["unique_graphs"] == graphs, "a weight swap recompiled the decode step"
    finally:
        engine.load_weights(version + 1, original)
        assert engine.wait_for_version(version + 1)


def test_engines_of_one_model_with_different_block_sizes_share_its_graph_correctly():
    """The block size is an input of the graph, not a constant in it: engines of one model with other block sizes
    reuse the compiled graph and still decode exactly."""
    model = make_model(2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = [random.Random(3).randrange(100) for _ in range(21)]
    expected = generate(model, prompt, params).token_ids
    engines = [TorchEngine(model, EngineConfig(kv_cache_bytes=4 * 2**20, block_size=size, speculative=False,
                                               compile_decode=True)) for size in (16, 4)]
    try:
        for _ in range(2):                     # interleaved: each engine's later steps skip most guards
            for engine in engines:
                assert run(engine, prompt, params)[0] == expected
    finally:
        for engine in engines:
            engine.close()


@pytest.mark.gpu
def test_compiled_decoding_on_cuda_equals_eager_decoding():
    model = make_model(0).cuda()
    prompts = [[random.Random(i).randrange(100) for _ in range(5 + 3 * i)] for i in range(4)]
    params = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=5)
    outputs = []
    for compiled in (False, True):
        engine = TorchEngine(model, EngineConfig(kv_cache_bytes=8 * 2**20, block_size=8, speculative=False,
                                                 compile_decode=compiled))
        try:
            outputs.append([run(engine, prompt, params)[:2] for prompt in prompts])
        finally:
            engine.close()
    for (eager_tokens, eager_logprobs), (graph_tokens, graph_logprobs) in zip(*outputs, strict=True):
        assert graph_tokens == eager_tokens
        torch.testing.assert_close(torch.tensor(graph_logprobs), torch.tensor(eager_logprobs), atol=2e-5, rtol=0)


@pytest.mark.parametrize("native", [True, False], ids=["c-attention", "torch-attention"])
def test_the_opaque_attention_op_passes_torch_opcheck(native):
    """Schema, fake (shape) kernel and real kernel agree, for steps of one and of two tokens per row (the latter
    hands the op a non-contiguous query): what torch.compile relies on when it traces around the op."""
    from forge.actors.engine.graph import OP

    generator = torch.Generator().manual_seed(0)
    layers, blocks, block_size, kv_heads, heads, dim = 2, 12, 4, 2, 4, 16
    for length in (1, 2):
        batch = 3
        q = torch.randn(batch, length, heads, dim, generator=generator).transpose(1, 2)
        k = torch.randn(batch, length, kv_heads, dim, generator=generator).transpose(1, 2)
        v = torch.randn(batch, length, kv_heads, dim, generator=generator).transpose(1, 2)
        keys = torch.randn(layers, blocks, block_size, kv_heads, dim, generator=generator)
        values = torch.randn(layers, blocks, block_size, kv_heads, dim, generator=generator)
        tables = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]])
        last = torch.tensor([9, 6, 10])                                  # each row's last new token
        query_slots = last.unsqueeze(-1) - torch.arange(length - 1, -1, -1)
        write_rows = torch.arange(batch * length)
        write_slots = (tables.gather(1, query_slots // block_size) * block_size + query_slots % block_size).flatten()
        torch.library.opcheck(getattr(torch.ops.forge, OP).default,
                              (q, k, v, keys, values, 1, write_rows, write_slots, tables, query_slots, 0, block_size,
                               dim**-0.5, native))
