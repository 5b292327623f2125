"""Qwen3-MoE: the model equals transformers' Qwen3MoeForCausalLM loaded from the same files (fp32, 1e-5), in both
directions; the grouped expert computation equals a per-token loop; routing records and replays exactly."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from forge.model import CausalLM, CheckpointError, ModelConfig, ModelConfigError
from forge.model.moe import Routing, expert_load, load_balancing_loss

from helpers.random_model import random_model

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=131, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24)
# norms away from 1, so that a misplaced one shows; confident routers, so that experts differ from token to token
CONFIDENT = dict(std=0.1, noise=0.2, router_scale=10.0)
CONFIGS = {
    "top2-every-layer": dict(BASE),
    "top3-normalised-tied": dict(BASE, num_experts_per_tok=3, norm_topk_prob=True, tie_word_embeddings=True),
    "sparse-step-2": dict(BASE, num_hidden_layers=4, decoder_sparse_step=2),
    "mlp-only-layer-0-mtp": dict(BASE, mlp_only_layers=(0,), num_nextn_predict_layers=1),
}


def hf_model(path) -> torch.nn.Module:
    return transformers.Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager").eval()


def ids_for(config: ModelConfig, shape=(3, 29), seed: int = 1) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("shard", [None, 30_000])
def test_logits_match_transformers(tmp_path, name, shard):
    config = ModelConfig(**CONFIGS[name])
    random_model(config, seed=len(name), **CONFIDENT).save_pretrained(tmp_path, max_shard_bytes=shard)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "qwen3_moe" and data["architectures"] == ["Qwen3MoeForCausalLM"]
    ours, reference = CausalLM.from_pretrained(tmp_path).eval(), hf_model(tmp_path)
    sparse = [i for i, layer in enumerate(reference.model.layers) if hasattr(layer.mlp, "experts")]
    assert sparse == list(config.sparse_layers)
    ids = ids_for(config)
    with torch.no_grad():
        expected = reference(ids).logits
        routing = Routing(record=True)
        actual = ours.logits(ours(ids, routing=routing))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    used = expert_load(routing.stack(), config.num_experts)
    assert (used > 0).sum() > config.num_experts, "the routers send every token to the same experts"


def test_loads_a_checkpoint_saved_by_transformers(tmp_path):
    hf_config = transformers.Qwen3MoeConfig(vocab_size=150, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                            norm_topk_prob=True, tie_word_embeddings=False, rope_theta=20_000.0)
    torch.manual_seed(3)
    reference = transformers.Qwen3MoeForCausalLM(hf_config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
            elif name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.5)
    reference.save_pretrained(tmp_path)
    ours = CausalLM.from_pretrained(tmp_path).eval()
    assert ours.config.num_experts == 4 and ours.config.norm_topk_prob
    ids = torch.randint(0, 150, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(ours(ids)), reference(ids).logits, atol=1e-5, rtol=0)


def test_save_load_round_trip_keeps_every_tensor_in_the_per_expert_layout(tmp_path):
    config = ModelConfig(**CONFIGS["mlp-only-layer-0-mtp"])
    model = random_model(config, seed=9, **CONFIDENT)
    model.save_pretrained(tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.mlp.experts.5.down_proj.weight" in index and "mtp.0.layer.mlp.experts.0.up_proj.weight" \
        in index and not any(name.endswith("gate_up_proj") for name in index)
    loaded = CausalLM.from_pretrained(tmp_path)
    assert loaded.config == config
    original = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_a_checkpoint_missing_an_expert_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    config = ModelConfig(**CONFIGS["top2-every-layer"])
    random_model(config, seed=2, **CONFIDENT).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.2.mlp.experts.3.up_proj.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"layers\.2\.mlp\.experts: no up_proj for experts \[3\]"):
        CausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(("change", "match"), [
    ({"num_experts_per_tok": 7}, "num_experts_per_tok"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
    ({"mlp_only_layers": [5]}, "mlp_only_layers"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ({"num_experts": None}, "num_experts"),
    ({"shared_expert_intermediate_size": 64}, "shared experts"),
])
def test_bad_moe_configs_are_refused_by_name(change, match):
    data = ModelConfig(**CONFIGS["top2-every-layer"]).to_hf_dict() | change
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict(data)


def test_a_dense_config_round_trips_without_moe_keys():
    data = ModelConfig(**{k: v for k, v in BASE.items() if "expert" not in k}).to_hf_dict()
    assert data["model_type"] == "qwen3" and "num_experts" not in data and "mlp_only_layers" not in data


def test_grouped_experts_equal_a_loop_over_tokens():
    config = ModelConfig(**CONFIGS["top3-normalised-tied"])
    moe = random_model(config, seed=4, **CONFIDENT).model.layers[0].mlp
    x = torch.randn(40, config.hidden_size, generator=torch.Generator().manual_seed(0), requires_grad=True)
    routing = Routing(record=True)
    out = moe(x, routing)
    chosen = routing.chosen[0]
    probs = moe.gate(x).softmax(-1)
    expected = []
    for t in range(x.shape[0]):
        weights = probs[t, chosen[t]]
        weights = weights / weights.sum()
        total = torch.zeros(config.hidden_size)
        for slot, e in enumerate(chosen[t].tolist()):
            gate, up = F.linear(x[t], moe.experts.gate_up_proj[e]).chunk(2)
            total = total + weights[slot] * F.linear(F.silu(gate) * up, moe.experts.down_proj[e])
        expected.append(total)
    expected = torch.stack(expected)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    grads = torch.autograd.grad(out.square().sum(), [x, moe.experts.gate_up_proj, moe.gate.weight])
    reference = torch.autograd.grad(expected.square().sum(), [x, moe.experts.gate_up_proj, moe.gate.weight])
    for grad, ref in zip(grads, reference, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-4, rtol=1e-4)


def test_replaying_a_recorded_routing_reproduces_the_forward_exactly():
    config = ModelConfig(**CONFIGS["sparse-step-2"])
    model = random_model(config, seed=6, **CONFIDENT).eval()
    ids = ids_for(config, (2, 17))
    with torch.no_grad():
        recorder = Routing(record=True)
        hidden = model(ids, routing=recorder)
        recorded = recorder.stack()
        assert recorded.shape == (len(config.sparse_layers), 2 * 17, config.num_experts_per_tok)
        replay = Routing(replay=recorded, record=True)
        assert torch.equal(model(ids, routing=replay), hidden)
        assert torch.equal(replay.stack(), recorded) and replay.mismatch() == 0.0


def test_a_replayed_routing_is_followed_and_its_mismatch_counted():
    config = ModelConfig(**CONFIGS["top2-every-layer"])
    model = random_model(config, seed=7, **CONFIDENT).eval()
    ids = ids_for(config, (1, 12))
    with torch.no_grad():
        recorder = Routing(record=True)
        own = model(ids, routing=recorder)
        forced = recorder.stack().clone()
        forced[1, :3] = (forced[1, :3] + 1) % config.num_experts      # three tokens of layer 1 elsewhere
        forced[2, 5:] = -1                                            # the router's own choice for these
        replay = Routing(replay=forced, record=True)
        replayed = model(ids, routing=replay)
        chosen = replay.stack()
        assert torch.equal(chosen[1, :3], forced[1, :3]) and torch.equal(chosen[2, 5:], recorder.stack()[2, 5:])
        assert not torch.allclose(replayed, own)
        assert replay.mismatch() == pytest.approx(3 / 5)              # 5 tokens fully replayed, 3 of them moved
        with pytest.raises(ValueError, match="replayed routing of sparse layer 0"):
            model(ids_for(config, (1, 13)), routing=Routing(replay=forced))


def test_the_load_balancing_loss_is_one_when_balanced_and_higher_when_not():
    balanced = torch.zeros(64, 4)
    assert load_balancing_loss([balanced], 2).item() == pytest.approx(1.0)
    skewed = torch.zeros(64, 4)
    skewed[:, 0] = 5.0
    assert load_balancing_loss([skewed, balanced], 1).item() > 1.5
    counts = expert_load(torch.tensor([[[0, 1], [0, 2]]]), 4)
    assert counts.tolist() == [[2, 1, 1, 0]]
