"""Tinker's built-in losses, with the semantics its documentation gives them (docs/losses.mdx of tinker-cookbook,
tinker-docs.thinkingmachines.ai/tinker/losses): per-token terms summed over every token of the batch (a sum, never a
mean), each token's term scaled by its ``weights`` (1 where the datum has none).

With p the model's probability of a target token (``logprobs`` out), q the sampler's (the ``logprobs`` input), A its
advantage and r = p / q:

- ``cross_entropy``: −log p. ``target_tokens`` and ``weights`` may be [N, K] (K candidate tokens per position,
  top-K distillation): each candidate is a term.
- ``importance_sampling``: −r·A.
- ``ppo``: −min(r·A, clip(r, low, high)·A).
- ``cispo``: −sg(clip(r, low, high))·A·log p (Forge's own CISPO terms, ``forge.learner.losses``).
- ``dro``: −(A·log p − ½·β·(log p − log q)²).

``low``/``high`` are ``loss_fn_config``'s ``clip_low_threshold``/``clip_high_threshold`` (ratios, not epsilons;
0.8 and 1.2 by default, Tinker's fixed ε = 0.2), or per-token arrays of the same names among the datum's inputs.
``dro`` needs ``loss_fn_config`` ``beta``: Tinker documents none by default, so none is guessed.

Refused with a user error, never replaced by another: ``gspo`` and ``stable_reinforce`` (sequence-level losses whose
exact semantics Tinker does not document), ``custom`` (the SDK computes a custom loss client-side and sends its
gradient through ``cross_entropy``; a loss uploaded to run on the server is not supported).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from forge.learner.losses import _cispo_terms
from forge.learner.tinker.types import Datum, UserError

DEFAULT_CLIP_LOW, DEFAULT_CLIP_HIGH = 0.8, 1.2
RL_INPUTS = ("target_tokens", "logprobs", "advantages")
CLIP_INPUTS = ("clip_low_threshold", "clip_high_threshold")


@dataclass(frozen=True)
class LossKind:
    required: tuple[str, ...]
    optional: tuple[str, ...] = ("weights",)
    config: dict[str, float | None] = field(default_factory=dict)     # key -> default (None: required)
    candidates: bool = False                                           # [N, K] targets allowed


LOSSES: dict[str, LossKind] = {
    "cross_entropy": LossKind(("target_tokens",), candidates=True),
    "importance_sampling": LossKind(RL_INPUTS),
    "ppo": LossKind(RL_INPUTS, ("weights", *CLIP_INPUTS),
                    {"clip_low_threshold": DEFAULT_CLIP_LOW, "clip_high_threshold": DEFAULT_CLIP_HIGH}),
    "cispo": LossKind(RL_INPUTS, ("weights", *CLIP_INPUTS),
                      {"clip_low_threshold": DEFAULT_CLIP_LOW, "clip_high_threshold": DEFAULT_CLIP_HIGH}),
    "dro": LossKind(RL_INPUTS, config={"beta": None}),
}
REFUSED = {
    "gspo": "gspo is a sequence-level loss whose exact semantics Tinker does not document; Forge does not guess "
            "them (use ppo, cispo or importance_sampling, or forward_backward_custom)",
    "stable_reinforce": "stable_reinforce's semantics are not documented by Tinker; Forge does not guess them (use "
                        "importance_sampling, ppo or cispo, or forward_backward_custom)",
    "custom": "a loss uploaded to run on the server is not supported: forward_backward_custom with a Python "
              "function runs it client-side (through cross_entropy)",
}


@dataclass(frozen=True)
class Loss:
    """A loss resolved from its name and ``loss_fn_config``."""

    name: str
    kind: LossKind
    config: dict[str, float]


def resolve_loss(name: str, config: Mapping[str, object] | None) -> Loss:
    """The loss ``name`` with its configuration checked; UserError for an unknown or refused loss or a bad key."""
    if name in REFUSED:
        raise UserError(f"loss {name!r} is not served: {REFUSED[name]}")
    if name not in LOSSES:
        raise UserError(f"unknown loss {name!r}: Forge serves {', '.join(LOSSES)}")
    kind = LOSSES[name]
    given = dict(config or {})
    unknown = sorted(set(given) - set(kind.config))
    if unknown:
        allowed = ", ".join(kind.config) or "none"
        raise UserError(f"loss {name} takes no loss_fn_config key {', '.join(map(repr, unknown))} (it takes: {allowed})")
    values: dict[str, float] = {}
    for key, default in kind.config.items():
        value = given.get(key, default)
        if value is None:
            raise UserError(f"loss {name} needs loss_fn_config {key!r} (Tinker documents no default)")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise UserError(f"loss_fn_config {key!r} must be a finite number, not {value!r}")
        values[key] = float(value)
    if "clip_low_threshold" in values:
        _check_thresholds(values["clip_low_threshold"], values["clip_high_threshold"])
    return Loss(name, kind, values)


def _check_thresholds(low: float | np.ndarray, high: float | np.ndarray) -> None:
    if np.any(np.asarray(low) < 0) or np.any(np.asarray(low) > np.asarray(high)):
        raise UserError("clip thresholds must satisfy 0 <= clip_low_threshold <= clip_high_threshold (they are "
                        "ratios, e.g. 0.8 and 1.2)")


def check_datum(loss: Loss, datum: Datum, index: int, vocab_size: int) -> int:
    """UserError unless ``datum`` holds what ``loss`` needs, shaped and typed as it must be; the number of
    candidate targets per position (1 unless [N, K] targets)."""
    where = f"datum {index}"
    tokens = np.asarray(datum.tokens)
    if tokens.ndim != 1 or tokens.size == 0 or tokens.dtype.kind not in "iu":
        raise UserError(f"{where}: model_input must be a non-empty sequence of token ids")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise UserError(f"{where}: a token id is outside the model's vocabulary (0..{vocab_size - 1})")
    keys = set(datum.inputs)
    missing = [k for k in loss.kind.required if k not in keys]
    unknown = sorted(keys - set(loss.kind.required) - set(loss.kind.optional))
    if missing or unknown:
        raise UserError(f"{where}: loss {loss.name} needs loss_fn_inputs {', '.join(loss.kind.required)}"
                        + (f" (optional: {', '.join(loss.kind.optional)})" if loss.kind.optional else "")
                        + (f"; missing {', '.join(missing)}" if missing else "")
                        + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    targets = np.asarray(datum.inputs["target_tokens"])
    shape_ok = targets.ndim == 1 or (loss.kind.candidates and targets.ndim == 2 and targets.shape[1] >= 1)
    if not shape_ok or targets.shape[0] != tokens.size or targets.dtype.kind not in "iu":
        expected = "[N] or [N, K]" if loss.kind.candidates else "[N]"
        raise UserError(f"{where}: target_tokens must be integers shaped {expected} with N = {tokens.size} (the "
                        f"model input's length), not {targets.dtype} {list(targets.shape)}")
    if targets.min() < 0 or targets.max() >= vocab_size:
        raise UserError(f"{where}: a target token is outside the model's vocabulary (0..{vocab_size - 1})")
    for key in keys - {"target_tokens"}:
        value = np.asarray(datum.inputs[key])
        if value.shape != (targets.shape if key == "weights" else (tokens.size,)):
            raise UserError(f"{where}: {key} must be shaped like target_tokens {list(targets.shape)}, not "
                            f"{list(value.shape)}")
        if value.dtype.kind not in "fiu" or not np.isfinite(value).all():
            raise UserError(f"{where}: {key} must hold finite numbers")
    if "clip_low_threshold" in keys or "clip_high_threshold" in keys:
        _check_thresholds(datum.inputs.get("clip_low_threshold", loss.config["clip_low_threshold"]),
                          datum.inputs.get("clip_high_threshold", loss.config["clip_high_threshold"]))
    return 1 if targets.ndim == 1 else int(targets.shape[1])


def term_inputs(loss: Loss, datum: Datum) -> dict[str, np.ndarray]:
    """The datum's per-term inputs, flattened (position-major), with its defaults filled in: weights 1, the
    thresholds from the configuration."""
    targets = np.asarray(datum.inputs["target_tokens"])
    inputs = {"weights": np.ones(targets.size, dtype=np.float32)}
    for key in loss.kind.required[1:]:
        inputs[key] = np.asarray(datum.inputs[key], dtype=np.float32).reshape(-1)
    for key in ("weights", *CLIP_INPUTS):
        if key in datum.inputs:
            inputs[key] = np.asarray(datum.inputs[key], dtype=np.float32).reshape(-1)
        elif key in loss.config:
            inputs[key] = np.full(targets.size, loss.config[key], dtype=np.float32)
    return inputs


def elementwise_loss(loss: Loss, logp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    """Each term's loss (its weight applied), differentiable in ``logp`` (the model's log-probabilities)."""
    weights = inputs["weights"]
    if loss.name == "cross_entropy":
        return -logp * weights
    old, advantages = inputs["logprobs"], inputs["advantages"]
    if loss.name == "importance_sampling":
        terms = torch.exp(logp - old) * advantages
    elif loss.name == "ppo":
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, inputs["clip_low_threshold"], inputs["clip_high_threshold"])
        terms = torch.minimum(ratio * advantages, clipped * advantages)
    elif loss.name == "cispo":      # Forge's CISPO: weight clip(r, 1 − ε_low, 1 + ε_high), detached, times A·log p
        terms = _cispo_terms(logp, old, advantages, 1.0 - inputs["clip_low_threshold"],
                             inputs["clip_high_threshold"] - 1.0)
    elif loss.name == "dro":
        terms = logp * advantages - 0.5 * loss.config["beta"] * (logp - old) ** 2
    else:
        raise UserError(f"unknown loss {loss.name!r}")
    return -terms * weights
