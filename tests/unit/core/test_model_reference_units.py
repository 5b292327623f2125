"""Model references: a built-in model (``tiny``, ``tiny-moe`` or their ids) or a checkpoint directory, resolved by forge.checkpoints.resolve_model
with one error message that every entry point reports unchanged (Hugging Face ids: test_hub_ids.py)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch

import forge.checkpoints.reference
from forge.actors.engine.policy import load_policy, model_id_of
from forge.assets import TINY_DIR, TINY_MOE_DIR, TINY_MOE_NAME, TINY_NAME, TOKENIZER_FILES
from forge.checkpoints import (
    ModelNotFound,
    ModelRef,
    builtin_model,
    load_model,
    load_tokenizer,
    resolve_model,
    tiny_config,
    tiny_model,
    tiny_tokenizer,
    write_builtin_checkpoint,
    write_tiny_checkpoint,
)
from forge.gateway.modelinfo import ModelInfo

MESSAGE = ("{} is neither a built-in model ('tiny', 'tiny-moe'), a checkpoint directory (no config.json in it) nor "
           "a Hugging Face model id (org/name or org/name@revision)")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("models") / "ckpt", seed=3)


@pytest.mark.parametrize("reference", ["tiny", TINY_NAME])
def test_the_builtin_model(reference):
    ref = resolve_model(reference)
    assert ref == ModelRef(reference, TINY_DIR, TINY_NAME, builtin=True)
    assert ref.has_weights == any(TINY_DIR.glob("*.safetensors"))
    assert model_id_of(reference) == TINY_NAME


def test_a_checkpoint_directory(checkpoint, monkeypatch):
    ref = resolve_model(checkpoint)
    assert ref.reference == checkpoint and ref.directory == checkpoint.resolve() and not ref.builtin
    assert ref.model_id == str(checkpoint.resolve()) == model_id_of(str(checkpoint))
    assert ref.has_weights
    monkeypatch.chdir(checkpoint.parent)
    relative = resolve_model(checkpoint.name)
    assert relative.reference == checkpoint.name and relative.directory == ref.directory
    assert relative.model_id == ref.model_id            # KV salts do not depend on how the directory was named
    assert resolve_model(ref) is ref


def test_a_directory_without_weights_has_none(tmp_path):
    (tmp_path / "config.json").write_text((TINY_DIR / "config.json").read_text())
    assert not resolve_model(tmp_path).has_weights


@pytest.mark.parametrize("kind", ["missing", "no config.json", "a file"])
def test_anything_else_is_one_error(tmp_path, kind):
    reference = tmp_path / "model"
    if kind == "no config.json":
        reference.mkdir()
        (reference / "tokenizer.json").write_text("{}")
    elif kind == "a file":
        reference.write_text("{}")
    for given in (reference, str(reference)):
        with pytest.raises(ModelNotFound) as caught:
            resolve_model(given)
        assert str(caught.value) == MESSAGE.format(reference)
        assert isinstance(caught.value, ValueError) and caught.value.reference == given
        assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)
    for load in (load_model, load_tokenizer, model_id_of, ModelInfo.load):
        with pytest.raises(ModelNotFound, match="is neither a built-in model"):
            load(str(reference))


def test_load_model_reads_the_weights(checkpoint):
    model, ref = load_model(str(checkpoint), dtype="bfloat16")
    assert ref == resolve_model(str(checkpoint))
    expected = tiny_model(seed=3).state_dict()
    loaded = model.state_dict()
    assert all(t.dtype == torch.bfloat16 for t in loaded.values())
    assert all(torch.equal(loaded[name], expected[name].to(torch.bfloat16)) for name in expected)
    policy, model_id = load_policy(str(checkpoint), "cpu", "float32")
    assert model_id == ref.model_id and next(policy.parameters()).dtype == torch.float32


def test_the_builtin_model_without_weights_is_a_fresh_init(tmp_path, monkeypatch, caplog):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((TINY_DIR / name).read_bytes())
    monkeypatch.setattr(forge.checkpoints.reference, "TINY_DIR", tmp_path)
    with caplog.at_level(logging.WARNING, logger="forge.checkpoints.load"):
        model, ref = load_model("tiny", dtype=torch.float64, seed=5)
    assert ref.builtin and ref.model_id == TINY_NAME and not ref.has_weights
    assert "no trained weights" in caplog.text
    expected = tiny_model(seed=5).state_dict()
    assert all(torch.equal(t, expected[name].double()) for name, t in model.state_dict().items())


def test_load_tokenizer(checkpoint):
    text = "Compute 2 + 3."
    assert load_tokenizer("tiny").encode(text) == tiny_tokenizer().encode(text)
    assert load_tokenizer(checkpoint).encode(text) == tiny_tokenizer().encode(text)


def test_the_gateway_resolves_the_same_way(checkpoint, tmp_path):
    assert ModelInfo.load("tiny").model_id == TINY_NAME
    assert ModelInfo.load(str(checkpoint)).model_id == resolve_model(checkpoint).model_id
    (tmp_path / "config.json").write_text((TINY_DIR / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        ModelInfo.load(str(tmp_path))


def test_the_trtllm_backend_resolves_the_same_way(checkpoint, monkeypatch):
    import forge.actors.trtllm.backend
    from forge.actors.trtllm.factory import trtllm_backend

    monkeypatch.setattr(forge.actors.trtllm.backend, "TrtllmBackend", lambda directory, *_, **__: directory)
    directory, model_id = trtllm_backend("tiny", 8)
    assert model_id == TINY_NAME and (Path(directory) / "model.safetensors").exists()
    assert trtllm_backend(str(checkpoint), 8) == (str(checkpoint.resolve()), str(checkpoint.resolve()))
    with pytest.raises(ModelNotFound):
        trtllm_backend(str(checkpoint / "missing"), 8)


def test_auto_dtype_is_the_checkpoints_own(tmp_path):
    import json

    import torch

    from forge.checkpoints import checkpoint_dtype, load_model, write_tiny_checkpoint

    assert checkpoint_dtype("tiny") == "float32"
    directory = write_tiny_checkpoint(tmp_path / "bf16")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16", "dtype": "bfloat16"}))
    assert checkpoint_dtype(directory) == "bfloat16"
    model, _ = load_model(directory, dtype="auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    (directory / "config.json").write_text(json.dumps({**config, "torch_dtype": "int8", "dtype": None}))
    assert checkpoint_dtype(directory) == "float32"


@pytest.mark.parametrize("reference", ["tiny-moe", TINY_MOE_NAME])
def test_the_builtin_moe_model(reference):
    ref = resolve_model(reference)
    assert ref == ModelRef(reference, TINY_MOE_DIR, TINY_MOE_NAME, builtin=True)
    assert ref.builtin_name == "tiny-moe" and resolve_model("tiny").builtin_name == "tiny"
    assert model_id_of(reference) == TINY_MOE_NAME


def test_the_moe_model_is_the_tiny_shape_with_experts_of_equal_active_size():
    dense, moe = tiny_config("tiny"), tiny_config("tiny-moe")
    assert moe.is_moe and not dense.is_moe
    assert moe.num_experts_per_tok * moe.moe_intermediate_size == dense.intermediate_size
    same = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "num_nextn_predict_layers", "eos_token_id", "pad_token_id")
    assert all(getattr(moe, name) == getattr(dense, name) for name in same)
    for name in TOKENIZER_FILES:                     # one tokenizer: the copy must not drift
        assert (TINY_MOE_DIR / name).read_bytes() == (TINY_DIR / name).read_bytes(), name
    assert load_tokenizer("tiny-moe").encode("Compute 2 + 3.") == tiny_tokenizer().encode("Compute 2 + 3.")


def test_a_builtin_moe_checkpoint_is_written_and_loads(tmp_path):
    directory = write_builtin_checkpoint(tmp_path / "moe", "tiny-moe", seed=4)
    model, ref = load_model(directory)
    assert model.config == tiny_config("tiny-moe") and not ref.builtin
    expected = builtin_model("tiny-moe", seed=4).state_dict()
    assert all(torch.equal(t, expected[name]) for name, t in model.state_dict().items())
    with pytest.raises(ModelNotFound, match="not a built-in model"):
        builtin_model("huge")
