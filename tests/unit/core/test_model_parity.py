"""The model equals transformers' Qwen3ForCausalLM loaded from the same files (fp32, 1e-5), in both directions."""

from __future__ import annotations

import pytest
import torch

from forge.model import CausalLM, CheckpointError, ModelConfig, ModelConfigError

from helpers.random_model import random_model

transformers = pytest.importorskip("transformers")

NOISY = dict(std=0.1, noise=0.2)      # norms and biases away from 1 and 0: a misplaced one shows
CONFIGS = {
    "mha-headdim-not-hidden-over-heads": dict(vocab_size=131, hidden_size=48, intermediate_size=80,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                               head_dim=16, tie_word_embeddings=False),
    "gqa4-tied-bias": dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                           attention_bias=True, rope_theta=500.0),
    "mqa-untied-mtp2": dict(vocab_size=211, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
                            num_nextn_predict_layers=2, rope_theta=1_000_000.0),
    "gqa2-tied-mtp1": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True,
                           num_nextn_predict_layers=1, rms_norm_eps=1e-5),
}


def hf_model(path) -> torch.nn.Module:
    return transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("shard", [None, 40_000])
def test_logits_match_transformers(tmp_path, name, shard):
    config = ModelConfig(**CONFIGS[name])
    random_model(config, seed=len(name), **NOISY).save_pretrained(tmp_path, max_shard_bytes=shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    ours = CausalLM.from_pretrained(tmp_path).eval()
    reference = hf_model(tmp_path)
    ids = torch.randint(0, config.vocab_size, (3, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        actual = ours.logits(ours(ids))
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_loads_a_checkpoint_saved_by_transformers(tmp_path):
    hf_config = transformers.Qwen3Config(vocab_size=150, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         tie_word_embeddings=False, rope_theta=20_000.0)
    torch.manual_seed(3)
    reference = transformers.Qwen3ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    reference.save_pretrained(tmp_path)
    ours = CausalLM.from_pretrained(tmp_path).eval()
    assert ours.config.rope_theta == 20_000.0
    ids = torch.randint(0, 150, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(ours(ids)), reference(ids).logits, atol=1e-5, rtol=0)


def test_explicit_position_ids_match_transformers(tmp_path):
    config = ModelConfig(**CONFIGS["gqa4-tied-bias"])
    random_model(config, seed=5, **NOISY).save_pretrained(tmp_path)
    ours, reference = CausalLM.from_pretrained(tmp_path).eval(), hf_model(tmp_path)
    ids = torch.randint(0, config.vocab_size, (2, 12))
    positions = torch.arange(7, 19).expand(2, 12)
    with torch.no_grad():
        expected = reference(ids, position_ids=positions).logits
        torch.testing.assert_close(ours.logits(ours(ids, positions)), expected, atol=1e-5, rtol=0)


def test_save_load_round_trip_keeps_every_tensor(tmp_path):
    config = ModelConfig(**CONFIGS["mqa-untied-mtp2"])
    model = random_model(config, seed=9, **NOISY)
    model.save_pretrained(tmp_path, max_shard_bytes=10_000)
    loaded = CausalLM.from_pretrained(tmp_path)
    assert loaded.config == config
    original = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_mismatched_checkpoints_are_refused_with_a_reason(tmp_path):
    config = ModelConfig(**CONFIGS["gqa2-tied-mtp1"])
    random_model(config, seed=2, **NOISY).save_pretrained(tmp_path)
    bad = dict(CONFIGS["gqa2-tied-mtp1"], intermediate_size=32)
    ModelConfig(**bad).save(tmp_path)
    with pytest.raises(CheckpointError, match=r"intermediate|shape"):
        CausalLM.from_pretrained(tmp_path)
    ModelConfig(**dict(CONFIGS["gqa2-tied-mtp1"], num_nextn_predict_layers=2)).save(tmp_path)
    with pytest.raises(CheckpointError, match=r"missing \['mtp\.1"):
        CausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 3}, "multiple"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}}, "rope type 'dynamic' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, "rope type 'longrope' is not supported"),
    ({"use_sliding_window": True}, "sliding"),
    ({"hidden_size": 0}, "positive"),
])
def test_unsupported_configs_are_refused(change, message):
    data = ModelConfig(**CONFIGS["mha-headdim-not-hidden-over-heads"]).to_hf_dict() | change
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf_dict(data)


SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-beta": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16.0,
                  "beta_slow": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
}


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_rope_scaled_checkpoints_match_transformers_beyond_the_original_window(tmp_path, scaling, moe):
    """A checkpoint whose config.json scales its rotary embedding (linear, YaRN, Llama 3), written by transformers:
    our logits equal its reference's at positions far beyond the original window (32), and the scaling survives
    our save."""
    rope = {"rope_theta": 10_000.0, **SCALINGS[scaling]}
    common = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=512, tie_word_embeddings=False, rope_parameters=rope)
    if moe:
        hf_config = transformers.Qwen3MoeConfig(**common, intermediate_size=96, moe_intermediate_size=32,
                                                num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
        reference_class = transformers.Qwen3MoeForCausalLM
    else:
        hf_config = transformers.Qwen3Config(**common, intermediate_size=96)
        reference_class = transformers.Qwen3ForCausalLM
    torch.manual_seed(5)
    reference_class(hf_config).save_pretrained(tmp_path / "hf")
    reference = reference_class.from_pretrained(tmp_path / "hf", dtype=torch.float32,
                                                attn_implementation="eager").eval()
    ours = CausalLM.from_pretrained(tmp_path / "hf").eval()
    assert ours.config.rope_type == rope["rope_type"]
    ids = torch.randint(0, 120, (2, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(ours.logits(ours(ids)), expected, atol=1e-5, rtol=0)
        ours.save_pretrained(tmp_path / "ours")
        again = reference_class.from_pretrained(tmp_path / "ours", dtype=torch.float32,
                                                attn_implementation="eager").eval()
        torch.testing.assert_close(again(ids).logits, expected, atol=1e-5, rtol=0)
    unscaled = ModelConfig.from_hf_dict({**hf_config.to_dict(), "rope_parameters": {"rope_theta": 10_000.0}})
    plain = CausalLM(unscaled).eval()
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():        # the scaling matters at these positions: the test can tell
        assert (plain.logits(plain(ids)) - expected).abs().max() > 1e-3


def test_the_fused_fp32_rms_norm_equals_the_reference_formula():
    """fp32 takes one fused op with the weight; it must give exactly what weight * normalise(x) gives (the bf16 path's
    formula), values and gradients, on random inputs."""
    from forge.model.qwen3 import RMSNorm

    generator = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=generator))
    x = torch.randn(5, 17, 96, generator=generator, requires_grad=True)
    fused = norm(x)
    reference = norm.weight * torch.nn.functional.rms_norm(x, (96,), eps=1e-6)
    torch.testing.assert_close(fused, reference, atol=0, rtol=0)
    upstream = torch.randn(fused.shape, generator=generator)
    got = torch.autograd.grad(fused, (x, norm.weight), upstream)
    expected = torch.autograd.grad(reference, (x, norm.weight), upstream)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
