"""Tinker's losses (forge.learner.tinker.tinker_losses) against their documented formulas, written out here on
random inputs: values and gradients (gspo datum by datum, as its page implements it); and the losses,
configurations and datums refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forge.learner.tinker.tinker_losses import (
    check_datum,
    elementwise_loss,
    resolve_loss,
    term_inputs,
)
from forge.learner.tinker.types import Datum, UserError

N = 64


def _inputs(seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, generator=generator, dtype=torch.float64) * 3
    inputs = {"logprobs": logp + torch.randn(N, generator=generator, dtype=torch.float64) * 0.5,
              "advantages": torch.randn(N, generator=generator, dtype=torch.float64),
              "weights": torch.rand(N, generator=generator, dtype=torch.float64)}
    return logp, inputs


def _documented(name: str, logp: torch.Tensor, q: torch.Tensor, a: torch.Tensor, low: float, high: float,
                beta: float) -> torch.Tensor:
    """Tinker's documented implementations (tinker-cookbook's losses page), per token."""
    ratio = torch.exp(logp - q)
    if name == "importance_sampling":
        return -(ratio * a)
    if name == "ppo":
        return -torch.min(ratio * a, torch.clamp(ratio, low, high) * a)
    if name == "cispo":
        return -(torch.clamp(ratio, low, high).detach() * logp * a)
    if name == "dro":
        return -(logp * a - 0.5 * beta * (logp - q) ** 2)
    return -logp


@pytest.mark.parametrize("name", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_losses_match_the_documented_formulas(name: str) -> None:
    logp, inputs = _inputs()
    config = {"dro": {"beta": 0.3}, "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}}.get(name)
    loss = resolve_loss(name, config)
    low, high = (0.9, 1.1) if name == "ppo" else (0.8, 1.2)
    inputs["clip_low_threshold"] = torch.full((N,), low, dtype=torch.float64)
    inputs["clip_high_threshold"] = torch.full((N,), high, dtype=torch.float64)
    ours_logp = logp.clone().requires_grad_(True)
    ours = elementwise_loss(loss, ours_logp, inputs)
    ours.sum().backward()
    theirs_logp = logp.clone().requires_grad_(True)
    theirs = _documented(name, theirs_logp, inputs["logprobs"], inputs["advantages"], low, high, 0.3) \
        * inputs["weights"]
    theirs.sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_logp.grad, theirs_logp.grad, rtol=1e-12, atol=1e-12)


def test_the_clip_thresholds_default_to_tinkers_and_can_be_given_per_token() -> None:
    loss = resolve_loss("ppo", None)
    assert loss.config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    tokens = np.arange(4)
    datum = Datum(tokens, {"target_tokens": tokens, "logprobs": np.zeros(4, np.float32),
                           "advantages": np.ones(4, np.float32),
                           "clip_high_threshold": np.array([1.5, 1.5, 2.0, 2.0], np.float32)})
    assert check_datum(loss, datum, 0, 16) == 1
    inputs = term_inputs(loss, datum)
    assert inputs["clip_high_threshold"].tolist() == [1.5, 1.5, 2.0, 2.0]
    assert inputs["clip_low_threshold"].tolist() == pytest.approx([0.8] * 4)
    assert inputs["weights"].tolist() == [1.0] * 4


@pytest.mark.parametrize(("name", "config", "message"), [
    ("stable_reinforce", None, "not served: its objective reads the stability information"),
    ("gspo", {"clip_eps": 0.2}, "takes no loss_fn_config"),
    ("gspo", {"clip_low_threshold": 1.3}, "clip thresholds"),
    ("gspo", {"clip_high_threshold": float("nan")}, "finite number"),
    ("custom", {"loss_id": 1.0}, "not served"),
    ("nope", None, "unknown loss"),
    ("dro", None, "beta"),
    ("ppo", {"clip_eps": 0.2}, "takes no loss_fn_config"),
    ("cross_entropy", {"beta": 1.0}, "takes no loss_fn_config"),
    ("ppo", {"clip_low_threshold": 1.5}, "clip thresholds"),
    ("cispo", {"clip_low_threshold": "low"}, "finite number"),
])
def test_refused_losses_and_configurations(name: str, config: dict | None, message: str) -> None:
    with pytest.raises(UserError, match=message):
        resolve_loss(name, config)


@pytest.mark.parametrize(("inputs", "message"), [
    ({}, "missing target_tokens"),
    ({"target_tokens": np.arange(3)}, "shaped"),
    ({"target_tokens": np.arange(4), "mask": np.ones(4)}, "unknown mask"),
    ({"target_tokens": np.arange(4) + 100}, "vocabulary"),
    ({"target_tokens": np.arange(4), "weights": np.array([1, np.nan, 1, 1])}, "finite"),
    ({"target_tokens": np.arange(4), "weights": np.ones(3)}, "shaped like"),
    ({"target_tokens": np.arange(4.0)}, "integers"),
])
def test_bad_datums_are_user_errors(inputs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        check_datum(resolve_loss("cross_entropy", None), Datum(np.arange(4), inputs), 0, 16)


def test_candidate_targets_are_cross_entropy_only() -> None:
    tokens = np.arange(4)
    candidates = np.stack([tokens, tokens + 1], axis=1)
    assert check_datum(resolve_loss("cross_entropy", None), Datum(tokens, {"target_tokens": candidates}), 0, 16) == 2
    rl = {"target_tokens": candidates, "logprobs": np.zeros(4), "advantages": np.zeros(4)}
    with pytest.raises(UserError, match="shaped"):
        check_datum(resolve_loss("importance_sampling", None), Datum(tokens, rl), 0, 16)


def _gspo_datums(seed: int, lengths: tuple[int, ...] = (5, 1, 9, 3)) -> list[Datum]:
    """Random gspo datums: sampler log-probs, advantages, weights, and a non-empty random sequence_ratio_mask."""
    rng = np.random.default_rng(seed)
    datums = []
    for n in lengths:
        mask = (rng.random(n) < 0.6).astype(np.float32)
        mask[rng.integers(n)] = 1.0
        datums.append(Datum(np.arange(n), {
            "target_tokens": rng.integers(0, 16, n), "logprobs": (-rng.random(n) * 3).astype(np.float32),
            "advantages": rng.normal(size=n).astype(np.float32), "weights": rng.random(n).astype(np.float32),
            "sequence_ratio_mask": mask * rng.choice([1.0, 0.5, 2.0], n).astype(np.float32)}))
    return datums


def _flat(loss_name: str, config: dict | None, datums: list[Datum]) -> dict[str, torch.Tensor]:
    loss = resolve_loss(loss_name, config)
    for i, datum in enumerate(datums):
        assert check_datum(loss, datum, i, 16) == 1
    inputs = [term_inputs(loss, datum) for datum in datums]
    return {key: torch.from_numpy(np.concatenate([i[key] for i in inputs])).double() for key in inputs[0]}


def _gspo_documented(logp: torch.Tensor, datum: Datum, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """tinker/losses/gspo's implementation for one datum, per token (the weights applied as for every loss)."""
    ref_logprobs = torch.from_numpy(datum.inputs["logprobs"]).double()
    advantages = torch.from_numpy(datum.inputs["advantages"]).double()
    in_ratio = torch.from_numpy(datum.inputs["sequence_ratio_mask"]) != 0
    log_ratio = (logp.detach() - ref_logprobs)[in_ratio].mean()
    ratio = torch.exp(log_ratio + logp - logp.detach())
    clipped_ratio = torch.clamp(ratio, low, high)
    objective = torch.min(ratio * advantages, clipped_ratio * advantages)
    return -objective * torch.from_numpy(datum.inputs["weights"]).double()


@pytest.mark.parametrize(("config", "low", "high"), [(None, 0.8, 1.2),
                                                     ({"clip_low_threshold": 0.95, "clip_high_threshold": 1.05},
                                                      0.95, 1.05)])
def test_gspo_matches_its_documented_implementation(config: dict | None, low: float, high: float) -> None:
    datums = _gspo_datums(1)
    inputs = _flat("gspo", config, datums)
    generator = torch.Generator().manual_seed(2)
    shift = torch.repeat_interleave(torch.tensor([0.35, -0.4, 0.02, 0.0], dtype=torch.float64),
                                    torch.tensor([d.tokens.size for d in datums]))     # ratios in and out of the clip
    logp = inputs["logprobs"] + shift + torch.randn(shift.shape, generator=generator, dtype=torch.float64) * 0.2
    assert inputs["clip_low_threshold"].tolist() == pytest.approx([low] * logp.numel())
    assert inputs["clip_high_threshold"].tolist() == pytest.approx([high] * logp.numel())
    ours_logp = logp.clone().requires_grad_(True)
    ours = elementwise_loss(resolve_loss("gspo", config), ours_logp, inputs)
    ours.sum().backward()
    theirs_logp = logp.clone().requires_grad_(True)
    low, high = float(np.float32(low)), float(np.float32(high))      # the term inputs are float32, like the SDK's
    theirs, start = [], 0
    for datum in datums:
        n = datum.tokens.size
        theirs.append(_gspo_documented(theirs_logp[start:start + n], datum, torch.tensor(low, dtype=torch.float64),
                                       torch.tensor(high, dtype=torch.float64)))
        start += n
    torch.cat(theirs).sum().backward()
    torch.testing.assert_close(ours, torch.cat(theirs), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_logp.grad, theirs_logp.grad, rtol=1e-12, atol=1e-12)
    # Each token has its own log-probability's gradient, scaled by the sequence ratio's value: −w·A·s where the
    # unclipped objective is the smaller, else none (the clipped ratio is constant).
    ratios = [torch.exp(((logp[o:o + d.tokens.size] - inputs["logprobs"][o:o + d.tokens.size])
                         [torch.from_numpy(d.inputs["sequence_ratio_mask"]) != 0]).mean()).expand(d.tokens.size)
              for d, o in zip(datums, np.cumsum([0, *[d.tokens.size for d in datums]]), strict=False)]
    s = torch.cat(ratios)
    a, w = inputs["advantages"], inputs["weights"]
    live = s * a <= torch.clamp(s, low, high) * a
    torch.testing.assert_close(ours_logp.grad, torch.where(live, -w * a * s, torch.zeros_like(s)), rtol=1e-12,
                               atol=1e-12)
    assert (~live).any() and live.any()


def test_gspo_defaults_and_explicit_thresholds_differ_where_the_ratio_lies_between() -> None:
    tokens = np.arange(3)
    datum = Datum(tokens, {"target_tokens": tokens, "logprobs": np.zeros(3, np.float32),
                           "advantages": np.ones(3, np.float32), "sequence_ratio_mask": np.array([0, 1, 1], np.float32)})
    logp = torch.tensor([5.0, 0.1, 0.1], dtype=torch.float64)      # s = e^0.1 ≈ 1.105: the unmarked token is left out
    by_default = elementwise_loss(resolve_loss("gspo", None), logp, _flat("gspo", None, [datum]))
    explicit = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}
    tighter = elementwise_loss(resolve_loss("gspo", explicit), logp, _flat("gspo", explicit, [datum]))
    torch.testing.assert_close(by_default, torch.full((3,), -np.exp(0.1), dtype=torch.float64))
    torch.testing.assert_close(tighter, torch.full((3,), -1.05, dtype=torch.float64))
    per_token = Datum(tokens, {**datum.inputs, "clip_high_threshold": np.array([1.05, 2.0, 2.0], np.float32)})
    mixed = elementwise_loss(resolve_loss("gspo", None), logp, _flat("gspo", None, [per_token]))
    torch.testing.assert_close(mixed, torch.tensor([-1.05, -np.exp(0.1), -np.exp(0.1)], dtype=torch.float64),
                               rtol=1e-6, atol=1e-7)


def test_gspo_terms_do_not_depend_on_the_order_datums_are_packed_in() -> None:
    datums = _gspo_datums(3)
    logp = [torch.from_numpy(d.inputs["logprobs"]).double() + 0.3 * torch.randn(d.tokens.size, dtype=torch.float64)
            for d in datums]
    loss = resolve_loss("gspo", None)
    forward = elementwise_loss(loss, torch.cat(logp), _flat("gspo", None, datums))
    order = [2, 0, 3, 1]
    shuffled = elementwise_loss(loss, torch.cat([logp[i] for i in order]), _flat("gspo", None,
                                                                                   [datums[i] for i in order]))
    pieces = dict(zip(order, torch.split(shuffled, [datums[i].tokens.size for i in order]), strict=True))
    torch.testing.assert_close(forward, torch.cat([pieces[i] for i in range(len(datums))]), rtol=0, atol=0)


@pytest.mark.parametrize(("change", "message"), [
    ({"sequence_ratio_mask": np.zeros(4, np.float32)}, "sequence_ratio_mask marks no token"),
    ({"sequence_ratio_mask": np.ones(3, np.float32)}, "sequence_ratio_mask must be shaped like"),
    ({"sequence_ratio_mask": np.array([1, np.inf, 0, 0], np.float32)}, "sequence_ratio_mask must hold finite"),
    ({"sequence_ratio_mask": None}, "missing sequence_ratio_mask"),
    ({"advantages": None}, "missing advantages"),
    ({"clip_low_threshold": np.full(4, 1.5, np.float32)}, "clip thresholds"),
    ({"target_tokens": np.stack([np.arange(4)] * 2, axis=1)}, "shaped"),
])
def test_bad_gspo_datums_are_user_errors(change: dict, message: str) -> None:
    inputs = {"target_tokens": np.arange(4), "logprobs": np.zeros(4, np.float32),
              "advantages": np.ones(4, np.float32), "sequence_ratio_mask": np.array([0, 1, 1, 0], np.float32)}
    inputs.update(change)
    inputs = {k: v for k, v in inputs.items() if v is not None}
    with pytest.raises(UserError, match=message):
        check_datum(resolve_loss("gspo", None), Datum(np.arange(4), inputs), 0, 16)
