"""Packed linear projections of the torch engine on CPU (oneDNN, fp32): equal to F.linear within fp32 rounding, inert
outside an engine step, single rows through a transposed copy, left out where they do not win (small weights, bf16,
other devices), and in the
engine the greedy tokens and log-probs of an engine without them (with MTP speculation, in graph mode), repacked by
a weight swap."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine import packed_linear
from forge.actors.engine.engine import TorchEngine
from forge.actors.engine.packed_linear import LinearPacks, PackableLinear, linear, pack_linears, supported
from forge.checkpoints import load_model, tiny_model
from forge.model import CausalLM
from forge.sampling.params import SamplingParams

needs_onednn = pytest.mark.skipif(bool(supported(torch.zeros(1))), reason=supported(torch.zeros(1)) or "")
pytestmark = needs_onednn

PROMPTS = [[5, 17, 300, 2, 9], [1000, 3, 3, 3], list(range(40, 80)), [7]]


@pytest.fixture
def pack_small(monkeypatch):
    """Pack the tiny model's weights too, which are below the size where packing wins."""
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)


def recorded_calls(monkeypatch, kernel_name: str) -> list[tuple[int, ...]]:
    """The row shapes of every call of ``packed_linear.<kernel_name>`` from here on."""
    calls: list[tuple[int, ...]] = []
    kernel = getattr(packed_linear, kernel_name)

    def counted(x, weight, bias):
        calls.append(tuple(x.shape[:-1]))
        return kernel(x, weight, bias)

    monkeypatch.setattr(packed_linear, kernel_name, counted)
    return calls


@pytest.fixture
def kernel_calls(monkeypatch) -> list[tuple[int, ...]]:
    """The row shapes of every call of the packed (oneDNN) kernel."""
    return recorded_calls(monkeypatch, "packed_kernel")


@pytest.fixture
def single_row_calls(monkeypatch) -> list[tuple[int, ...]]:
    """The row shapes of every call of the single-row kernel."""
    return recorded_calls(monkeypatch, "single_row_kernel")


def assert_fp32_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.detach().abs().max()))


@pytest.mark.parametrize("out_features,in_features", [(48, 32), (256, 768), (768, 256), (1024, 128)])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_packed_linear_equals_f_linear_for_any_batch(out_features, in_features, bias):
    torch.manual_seed(out_features + in_features)
    module = nn.Linear(in_features, out_features, bias=bias)
    packs = LinearPacks(module, min_elements=0)
    assert isinstance(module, PackableLinear)
    with torch.inference_mode():
        for shape in [(1, in_features), (2, in_features), (3, in_features), (33, in_features),
                      (2, 5, in_features), (1, 7, in_features), (0, in_features)]:
            x = torch.randn(shape)
            with packs.active():
                got = module(x)
            want = F.linear(x, module.weight, module.bias)
            assert got.shape == want.shape
            if want.numel():
                assert_fp32_close(got, want)


def test_packs_are_used_inside_active_only_and_keep_autograd_outside():
    torch.manual_seed(0)
    module = nn.Linear(64, 96)
    packs = LinearPacks(module, min_elements=0)
    x = torch.randn(4, 64)
    with torch.no_grad():
        module.weight.mul_(2.0)          # written behind the packs' back: only a stale pack would still see the old
    with torch.no_grad(), packs.active():
        stale = module(x)
    packs.repack()
    with torch.no_grad(), packs.active():
        fresh = module(x)
    want = F.linear(x, module.weight, module.bias)
    assert not torch.allclose(stale, want)
    assert_fp32_close(fresh, want)
    x.requires_grad_(True)
    module(x).sum().backward()           # outside active(): plain F.linear, gradients as ever
    assert x.grad is not None and module.weight.grad is not None
    torch.testing.assert_close(x.grad, module.weight.sum(0).expand(4, 64))


def test_packs_made_from_a_version_before_it_is_written_equal_a_repack():
    torch.manual_seed(2)
    module = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 64, bias=False))
    packs = LinearPacks(module, min_elements=0)
    new = {name: torch.randn_like(value) for name, value in module.state_dict().items()}
    prepared = packs.packs_of(new)
    x = [torch.randn(1, 64), torch.randn(5, 64)]
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            tensor.copy_(new[name])
    with torch.no_grad(), packs.active():
        stale = [module(v) for v in x]
    packs.install(prepared)
    with torch.no_grad(), packs.active():
        fresh = [module(v) for v in x]
    for old, got, v in zip(stale, fresh, x, strict=True):
        want = module[1](F.linear(v, module[0].weight, module[0].bias))
        assert not torch.allclose(old, want)
        assert_fp32_close(got, want)


def test_compiled_code_runs_f_linear_inside_active():
    torch.manual_seed(0)
    module = nn.Linear(32, 48)
    packs = LinearPacks(module, min_elements=0)
    compiled = torch.compile(lambda x: torch.relu(module(x)), fullgraph=True, dynamic=True)
    x = torch.randn(5, 32)
    with torch.inference_mode(), packs.active():
        got = compiled(x)
    assert_fp32_close(got, torch.relu(F.linear(x, module.weight, module.bias)))


def test_the_output_head_is_packed_and_a_detached_head_is_not(pack_small, kernel_calls):
    model, _ = load_model("tiny")
    packs = pack_linears(model)
    assert packs is not None and model.head_linear is linear
    assert any(w is model.output_weight for w in packs.weights)
    assert {id(w) for w in packs.weights} >= {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    hidden = torch.randn(3, model.config.hidden_size)
    with torch.inference_mode(), packs.active():
        assert_fp32_close(model.logits(hidden), F.linear(model.model.norm(hidden), model.output_weight))
        assert kernel_calls == [(3,)]
        detached = model.mtp_logits(hidden, detach_head=True)       # the learner's draft co-training: not packed
        assert kernel_calls == [(3,)]
    assert_fp32_close(detached, F.linear(model.mtp[0].norm(hidden), model.output_weight))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_single_rows_run_on_the_transposed_copy(bias, kernel_calls, single_row_calls):
    torch.manual_seed(1)
    module = nn.Linear(768, 1024, bias=bias)
    packs = LinearPacks(module)
    with torch.inference_mode(), packs.active():
        for shape in [(1, 768), (1, 1, 768), (2, 768)]:
            x = torch.randn(shape)
            got = module(x)
            assert got.shape == (*shape[:-1], 1024)
            assert_fp32_close(got, F.linear(x, module.weight, module.bias))
    assert single_row_calls == [(1,), (1, 1)] and kernel_calls == [(2,)]
    with torch.no_grad():
        module.weight.mul_(-1.0)
    packs.repack()                       # the transposed copy follows the weight as the blocked one does
    x = torch.randn(1, 768)
    with torch.inference_mode(), packs.active():
        assert_fp32_close(module(x), F.linear(x, module.weight, module.bias))


def test_only_weights_large_enough_to_gain_are_packed():
    tiny, _ = load_model("tiny")
    assert pack_linears(tiny) is None                   # every weight is below MIN_ELEMENTS
    assert all(type(m) is nn.Linear for m in tiny.modules() if isinstance(m, nn.Linear))
    small, large = nn.Linear(128, 128), nn.Linear(1024, 768)
    packs = LinearPacks(nn.Sequential(small, large))
    assert [w is large.weight for w in packs.weights] == [True]
    assert type(small) is nn.Linear and type(large) is PackableLinear


def test_bf16_and_other_devices_are_left_to_f_linear(pack_small):
    model, _ = load_model("tiny", dtype=torch.bfloat16)
    assert pack_linears(model) is None and "bfloat16" in supported(model.output_weight)
    assert "meta" in supported(torch.zeros(1, device="meta"))


def greedy(engine: TorchEngine, prompts: list[list[int]], tokens: int = 16) -> list[tuple[list[int], list[float]]]:
    streams = [engine.submit(GenerationRequest("", p, SamplingParams(temperature=0, max_tokens=tokens,
                                                                     ignore_eos=True)))
               for p in prompts]
    out = []
    for stream in streams:
        ids, logprobs = [], []
        for chunk in stream:
            ids += chunk.token_ids
            logprobs += chunk.logprobs
        out.append((ids, logprobs))
    return out


def engine_for(model: CausalLM, **overrides) -> TorchEngine:
    return TorchEngine(model, EngineConfig(**{"kv_cache_bytes": 8 * 2**20, "block_size": 8, **overrides}))


def assert_same_outputs(got, want) -> None:
    for (ids, logprobs), (want_ids, want_logprobs) in zip(got, want, strict=True):
        assert ids == want_ids
        assert logprobs == pytest.approx(want_logprobs, abs=1e-5)


def outputs(model: CausalLM, **config) -> list[tuple[list[int], list[float]]]:
    engine = engine_for(model, **config)
    try:
        return greedy(engine, PROMPTS)
    finally:
        engine.close()


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "mtp"])
def test_engine_gives_the_same_greedy_tokens_with_and_without_packing(speculative, pack_small, kernel_calls):
    model, _ = load_model("tiny")
    engine = engine_for(model, speculative=speculative)
    assert engine.runner.packs is not None
    try:
        packed = greedy(engine, PROMPTS)
    finally:
        engine.close()
    assert kernel_calls, "the engine never ran the packed kernel"
    kernel_calls.clear()
    unpacked = engine_for(copy.deepcopy(model), speculative=speculative, packed_linear=False)
    assert unpacked.runner.packs is None
    try:
        assert_same_outputs(packed, greedy(unpacked, PROMPTS))
    finally:
        unpacked.close()
    assert not kernel_calls


@pytest.mark.skipif(not torch._dynamo.is_dynamo_supported(), reason="torch.compile is unsupported here")
def test_graph_mode_with_packing_gives_the_eager_greedy_tokens(pack_small, kernel_calls):
    model, _ = load_model("tiny")
    engine = engine_for(model, speculative=False, compile_decode=True)
    try:
        compiled = greedy(engine, PROMPTS)
        assert engine.runner.compiled is not None and engine.runner.compiled.warm
    finally:
        engine.close()
    assert kernel_calls                 # prefill and the output head, outside the compiled step
    assert_same_outputs(compiled, outputs(copy.deepcopy(model), speculative=False, packed_linear=False))


def test_weight_swap_repacks(pack_small, single_row_calls):
    model, _ = load_model("tiny")
    new_weights = tiny_model(seed=1).state_dict()
    engine = engine_for(model, speculative=True)
    try:
        before = greedy(engine, PROMPTS)
        engine.load_weights(1, new_weights)
        assert engine.wait_for_version(1)
        after = greedy(engine, PROMPTS)
        alone = greedy(engine, PROMPTS[:1])              # one sequence: the single-row copies
    finally:
        engine.close()
    assert single_row_calls
    fresh = CausalLM(model.config)
    fresh.load_state_dict(new_weights)
    want = outputs(fresh.eval(), speculative=True, packed_linear=False)
    assert [ids for ids, _ in before] != [ids for ids, _ in want]
    assert_same_outputs(after, want)
    assert_same_outputs(alone, want[:1])


def test_engines_without_packs_for_bf16_or_when_switched_off(pack_small):
    engine = engine_for(load_model("tiny", dtype=torch.bfloat16)[0])
    try:
        assert engine.runner.packs is None
        assert all(len(ids) == 16 for ids, _ in greedy(engine, PROMPTS[:1]))
    finally:
        engine.close()
    fp32, _ = load_model("tiny")
    off = engine_for(fp32, packed_linear=False)
    off.close()
    assert off.runner.packs is None and all(type(m) is not PackableLinear for m in fp32.modules())
