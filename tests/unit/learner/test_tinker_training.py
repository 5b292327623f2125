"""LearnerTraining (forge.learner.tinker.training) on the built-in model: packed passes equal unpacked ones
(log-probabilities and gradients), forward equals forward_backward, importance sampling against the model's own
log-probabilities has ratio 1, the loss falls, two models on one base keep apart, a restarted server resumes exactly,
prompt log-probabilities match an independent forward, and bad requests change nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from forge.checkpoints.load import load_model
from forge.learner.tinker.adapters import LORA_ALPHA
from forge.learner.tinker.packed_forward import packed_logprobs
from forge.learner.tinker.training import LearnerTraining
from forge.learner.tinker.types import AdamSpec, Datum, LoraSpec, NotFound, UserError

VOCAB = 1000


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> LearnerTraining:
    return LearnerTraining(tmp_path_factory.mktemp("tinker"), token_budget=24)


def _batch(seed: int, count: int = 4, prompt: int = 12, completion: int = 6) -> list[Datum]:
    """Datums sharing a prompt (so the trees share prefixes), with next-token targets and random weights."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, VOCAB, prompt)
    data = []
    for _ in range(count):
        sequence = np.concatenate([shared, rng.integers(0, VOCAB, rng.integers(1, completion + 1))])
        data.append(Datum(sequence[:-1], {"target_tokens": sequence[1:],
                                          "weights": rng.random(len(sequence) - 1).astype(np.float32)}))
    return data


def _params(training: LearnerTraining, model_id: str) -> dict[str, torch.Tensor]:
    base = training.loaded[model_id].base
    return base.state(model_id)


def _grads(training: LearnerTraining, model_id: str) -> dict[str, torch.Tensor | None]:
    base = training.loaded[model_id].base
    return {n: None if p.grad is None else p.grad.clone() for n, p in base.parameters(model_id).items()}


def _unpacked_logprobs(policy, tokens: np.ndarray, targets: np.ndarray) -> torch.Tensor:
    ids = torch.as_tensor(tokens, dtype=torch.long).unsqueeze(0)
    logprobs = torch.log_softmax(policy.logits(policy(ids)[0]).float(), dim=-1)
    targets = torch.as_tensor(targets, dtype=torch.long)
    return logprobs.gather(-1, targets.view(len(tokens), -1)).view(targets.shape)


def _trained_model(training: LearnerTraining, seed: int = 1, **lora) -> str:
    """A model with a few steps behind it (so its B matrices are not zero)."""
    model_id = training.create_model("alice", "tiny", LoraSpec(rank=4, seed=seed, **lora)).model_id
    for step in range(2):
        training.forward(model_id, _batch(100 + step), "cross_entropy", None, True)
        training.optim_step(model_id, AdamSpec(learning_rate=1e-2))
    return model_id


def test_packed_passes_equal_unpacked_ones(training: LearnerTraining) -> None:
    model_id = _trained_model(training)
    base = training.loaded[model_id].base
    base.activate(model_id)
    rng = np.random.default_rng(7)
    data = _batch(3, count=6, prompt=20)
    tokens = [d.tokens for d in data]
    targets = [rng.integers(0, VOCAB, (len(d.tokens), 2)) if i % 2 else rng.integers(0, VOCAB, len(d.tokens))
               for i, d in enumerate(data)]        # arbitrary targets, some with two candidates per position
    scale = torch.from_numpy(rng.standard_normal(sum(t.size for t in targets)).astype(np.float32))
    parameters = base.parameters(model_id)
    for p in parameters.values():
        p.grad = None
    packed = packed_logprobs(base.policy, tokens, targets, 16,
                             lambda logp, index: (logp * scale[torch.from_numpy(index)]).sum())
    packed_grads = {n: p.grad.clone() for n, p in parameters.items()}
    for p in parameters.values():
        p.grad = None
    unpacked = torch.cat([_unpacked_logprobs(base.policy, t, y).reshape(-1) for t, y in zip(tokens, targets,
                                                                                               strict=True)])
    (unpacked * scale).sum().backward()
    np.testing.assert_allclose(packed, unpacked.detach().numpy(), rtol=0, atol=2e-5)
    for name, grad in packed_grads.items():
        # float32 sums in another order: an element's error scales with the tensor's largest, not its own size
        scale = max(1.0, float(parameters[name].grad.abs().max()))
        torch.testing.assert_close(grad, parameters[name].grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
        parameters[name].grad = None


def test_forward_equals_forward_backward_and_gradients_add_up(training: LearnerTraining) -> None:
    model_id = _trained_model(training, seed=2)
    data = _batch(4)
    forward = training.forward(model_id, data, "cross_entropy", None, False)
    assert all(g is None for g in _grads(training, model_id).values())          # forward leaves no gradient
    both = training.forward(model_id, data, "cross_entropy", None, True)
    whole = _grads(training, model_id)
    for a, b, datum in zip(forward.outputs, both.outputs, data, strict=True):
        assert a["logprobs"].dtype == np.float32
        np.testing.assert_array_equal(a["logprobs"], b["logprobs"])
        np.testing.assert_allclose(a["elementwise_loss"], -a["logprobs"] * datum.inputs["weights"], rtol=1e-6)
    assert forward.metrics["loss:sum"] == pytest.approx(both.metrics["loss:sum"])
    expected = sum(float((-o["logprobs"] * d.inputs["weights"]).astype(np.float64).sum())
                   for o, d in zip(forward.outputs, data, strict=True))
    assert forward.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    for p in training.loaded[model_id].base.parameters(model_id).values():
        p.grad = None
    training.forward(model_id, data[:2], "cross_entropy", None, True)
    training.forward(model_id, data[2:], "cross_entropy", None, True)
    for name, grad in _grads(training, model_id).items():
        torch.testing.assert_close(grad, whole[name], rtol=1e-4, atol=1e-6, msg=name)
    training.optim_step(model_id, AdamSpec(learning_rate=0.0))


def test_importance_sampling_with_the_models_own_logprobs_has_ratio_one(training: LearnerTraining) -> None:
    model_id = _trained_model(training, seed=3)
    data = _batch(5)
    own = training.forward(model_id, data, "cross_entropy", None, False).outputs
    rl = [Datum(d.tokens, {"target_tokens": d.inputs["target_tokens"], "logprobs": o["logprobs"],
                           "advantages": np.ones(len(d.tokens), np.float32)}) for d, o in zip(data, own, strict=True)]
    result = training.forward(model_id, rl, "importance_sampling", None, True)
    for output in result.outputs:
        np.testing.assert_allclose(-output["elementwise_loss"], 1.0, rtol=0, atol=1e-5)
    training.optim_step(model_id, AdamSpec(learning_rate=0.0))


def test_the_loss_falls(training: LearnerTraining) -> None:
    model_id = training.create_model("alice", "tiny", LoraSpec(rank=8, seed=4)).model_id
    data = _batch(6)
    losses = []
    for _ in range(6):
        losses.append(training.forward(model_id, data, "cross_entropy", None, True).metrics["loss:sum"])
        training.optim_step(model_id, AdamSpec(learning_rate=5e-3))
    assert losses[-1] < 0.7 * losses[0], losses


def test_two_models_on_one_base_keep_apart(training: LearnerTraining) -> None:
    first = training.create_model("alice", "tiny", LoraSpec(rank=4, seed=5)).model_id
    second = training.create_model("bob", "tiny", LoraSpec(rank=2, seed=6, train_mlp=False,
                                                           train_unembed=False)).model_id
    assert training.loaded[first].base is training.loaded[second].base
    data = _batch(7)
    before = training.forward(second, data, "cross_entropy", None, True).outputs
    second_params, second_grads = _params(training, second), _grads(training, second)
    assert not any("mlp" in name or "lm_head" in name for name in second_params)
    for _ in range(2):
        training.forward(first, data, "cross_entropy", None, True)
        training.optim_step(first, AdamSpec(learning_rate=1e-2))
    after = training.forward(second, data, "cross_entropy", None, False).outputs
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a["logprobs"], b["logprobs"])
    for name, value in _params(training, second).items():
        torch.testing.assert_close(value, second_params[name], rtol=0, atol=0)
    for name, grad in _grads(training, second).items():
        torch.testing.assert_close(grad, second_grads[name], rtol=0, atol=0)
    assert {m.model_id for m in training.models("bob")} == {second}


def test_a_restarted_server_resumes_exactly(tmp_path: Path) -> None:
    def step(training: LearnerTraining, model_id: str, seed: int) -> None:
        training.forward(model_id, _batch(seed), "cross_entropy", None, True)
        training.optim_step(model_id, AdamSpec(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0))

    first = LearnerTraining(tmp_path, token_budget=24)
    model_id = first.create_model("alice", "tiny", LoraSpec(rank=4, seed=8)).model_id
    step(first, model_id, 10)
    step(first, model_id, 11)
    saved = first.save_state(model_id, "mid")
    assert saved.path == f"tinker://{model_id}/weights/mid" and saved.kind == "training" and saved.size_bytes > 0
    step(first, model_id, 12)
    uninterrupted = _params(first, model_id)

    second = LearnerTraining(tmp_path, token_budget=24)
    assert second.model_info(model_id) == first.model_info(model_id)
    assert [c.path for c in second.checkpoints(model_id)] == [saved.path]
    second.load_state(model_id, saved.path, with_optimizer=True)
    step(second, model_id, 12)
    for name, value in _params(second, model_id).items():
        torch.testing.assert_close(value, uninterrupted[name], rtol=0, atol=1e-7, msg=name)

    third = LearnerTraining(tmp_path, token_budget=24)     # weights alone: a fresh optimizer, a different step
    third.load_state(model_id, saved.path, with_optimizer=False)
    step(third, model_id, 12)
    assert any(not torch.allclose(v, uninterrupted[n]) for n, v in _params(third, model_id).items())


def test_prompt_logprobs_match_an_independent_forward(training: LearnerTraining) -> None:
    model_id = _trained_model(training, seed=9)
    sampler = training.save_sampler(model_id, "sampler-1")
    assert sampler.path == f"tinker://{model_id}/sampler_weights/sampler-1" and sampler.kind == "sampler"
    info, weights = training.sampler_weights(sampler.path)
    assert info.model_id == model_id and float(weights["lora.scaling"]) == LORA_ALPHA / 4
    tokens = np.random.default_rng(10).integers(0, VOCAB, 15).tolist()

    fresh, _ = load_model("tiny")
    scale = LORA_ALPHA / 4
    with torch.no_grad():
        reference = _unpacked_logprobs(fresh, np.array(tokens[:-1]), np.array(tokens[1:]))
        base_lp, _ = training.prompt_logprobs("tiny", None, tokens)
        assert base_lp[0] is None
        np.testing.assert_allclose(base_lp[1:], reference.numpy(), rtol=0, atol=1e-5)
        state = fresh.state_dict()
        for name in weights:
            if name.endswith(".lora_A.weight") and not name.startswith("lm_head"):
                module = name.removesuffix(".lora_A.weight")
                b = weights[f"{module}.lora_B.weight"]
                state[f"{module}.weight"] += scale * b @ weights[name]
        fresh.load_state_dict(state)
        ids = torch.tensor(tokens[:-1]).unsqueeze(0)
        normed = fresh.model.norm(fresh(ids)[0])
        head = fresh.output_weight + scale * weights["lm_head.lora_B.weight"] @ weights["lm_head.lora_A.weight"]
        merged = torch.log_softmax(normed @ head.T, dim=-1).gather(-1, torch.tensor(tokens[1:]).unsqueeze(-1))
        adapted, top = training.prompt_logprobs("tiny", sampler.path, tokens, top_k=3)
    np.testing.assert_allclose(adapted[1:], merged.squeeze(-1).numpy(), rtol=0, atol=1e-5)
    assert top[0] is None and len(top[1]) == 3 and top[1][0][1] >= top[1][1][1]
    assert not np.allclose(adapted[1:], base_lp[1:])


def test_bad_requests_change_nothing(training: LearnerTraining) -> None:
    model_id = _trained_model(training, seed=11)
    params = _params(training, model_id)
    good = _batch(12)
    bad_token = Datum(np.array([1, 2, VOCAB + 50]), {"target_tokens": np.array([2, 3, 4])})
    for data, loss, config in [
        ([*good, bad_token], "cross_entropy", None),
        (good, "gspo", None),
        (good, "ppo", {"clip_low_threshold": 2.0}),
        ([], "cross_entropy", None),
        (good, "importance_sampling", None),            # no logprobs nor advantages
    ]:
        with pytest.raises(UserError):
            training.forward(model_id, data, loss, config, True)
    assert all(g is None for g in _grads(training, model_id).values())
    with pytest.raises(NotFound):
        training.forward("no-such-model", good, "cross_entropy", None, True)
    with pytest.raises(UserError):
        training.optim_step(model_id, AdamSpec(learning_rate=-1.0))
    for path in ["tinker://../weights/x", f"tinker://{model_id}/weights/../../models", f"tinker://{model_id}/x/y",
                 "file:///etc/passwd", f"tinker://{model_id}/weights/.hidden"]:
        with pytest.raises(UserError):
            training.load_state(model_id, path, with_optimizer=False)
    with pytest.raises(NotFound):
        training.load_state(model_id, f"tinker://{model_id}/weights/never-saved", with_optimizer=True)
    with pytest.raises(UserError):
        training.save_state(model_id, "../escape")
    with pytest.raises(UserError):
        training.create_model("alice", "no/such-model-here", LoraSpec(rank=4))
    with pytest.raises(UserError):
        training.create_model("alice", "tiny", LoraSpec(rank=0))
    other = training.create_model("bob", "tiny", LoraSpec(rank=8, seed=1)).model_id
    saved = training.save_state(other, None)
    with pytest.raises(UserError, match="checkpoint's"):
        training.load_state(model_id, saved.path, with_optimizer=True)       # rank 8 onto rank 4
    for name, value in _params(training, model_id).items():
        torch.testing.assert_close(value, params[name], rtol=0, atol=0)


def test_checkpoints_are_listed_and_deleted(training: LearnerTraining) -> None:
    model_id = _trained_model(training, seed=12)
    first = training.save_state(model_id, None)
    second = training.save_state(model_id, None)
    sampler = training.save_sampler(model_id, None)
    assert first.checkpoint_id != second.checkpoint_id
    assert {c.checkpoint_id for c in training.checkpoints(model_id)} == {first.checkpoint_id, second.checkpoint_id,
                                                                        sampler.checkpoint_id}
    training.delete_checkpoint(model_id, first.checkpoint_id)
    assert first.checkpoint_id not in {c.checkpoint_id for c in training.checkpoints(model_id)}
    with pytest.raises(NotFound):
        training.delete_checkpoint(model_id, first.checkpoint_id)
    with pytest.raises(UserError):
        training.delete_checkpoint(model_id, "weights/../../x")
    training.unload(model_id)
    assert model_id not in training.loaded
    training.load_state(model_id, second.path, with_optimizer=True)         # back on its base, resumed
