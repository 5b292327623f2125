"""Tinker's losses (forge.learner.tinker.tinker_losses) against their documented formulas, written out here on
random inputs: values and gradients; and the losses and configurations refused."""

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
    """Tinker's documented implementations (docs/losses.mdx), per token."""
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
    ("gspo", None, "not served"),
    ("stable_reinforce", None, "not served"),
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
