"""Tinker's built-in losses, with the semantics its documentation gives them (tinker-cookbook's losses page,
tinker-docs.thinkingmachines.ai/tinker/losses): per-token terms summed over every token of the batch (a sum, never a
mean), each token's term scaled by its ``weights`` (1 where the datum has none).

With p the model's probability of a target token (``logprobs`` out), q the sampler's (the ``logprobs`` input), A its
advantage, r = p / q and sg a stop-gradient:

- ``cross_entropy``: −log p. ``target_tokens`` and ``weights`` may be [N, K] (K candidate tokens per position,
  top-K distillation): each candidate is a term.
- ``importance_sampling``: −r·A.
- ``ppo``: −min(r·A, clip(r, low, high)·A).
- ``cispo``: −sg(clip(r, low, high))·A·log p (Forge's own CISPO terms, ``forge.learner.losses``).
- ``dro``: −(A·log p − ½·β·(log p − log q)²).
- ``gspo`` (GSPO-token): −min(s_t·A, clip(s_t, low, high)·A), where the datum's sequence ratio
  s = exp(mean over the tokens M that ``sequence_ratio_mask`` marks (≠ 0) of log(sg(p) / q)) and s_t = sg(s)·p/sg(p):
  every token carries s's value with the gradient of its own log p (tinker/losses/gspo). M must hold a token: the
  documented mean over no token is undefined (NaN), so such a datum is a user error.

``low``/``high`` are ``loss_fn_config``'s ``clip_low_threshold``/``clip_high_threshold`` (ratios, not epsilons;
0.8 and 1.2 by default, Tinker's fixed ε = 0.2), or per-token arrays of the same names among the datum's inputs.
``dro`` needs ``loss_fn_config`` ``beta``: Tinker documents none by default, so none is guessed.

Refused with a user error, never replaced by another: ``stable_reinforce`` (its objective reads stability
information Tinker's sampler records per sampled sequence and training requests name by ``sequence_id``; what that
information is, and the objective over it, Tinker does not document), ``custom`` (the SDK computes a custom loss
client-side and sends its gradient through ``cross_entropy``; a loss uploaded to run on the server is not supported).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from forge.learner.losses import cispo_terms
from forge.learner.tinker.types import Datum, UserError

DEFAULT_CLIP_LOW, DEFAULT_CLIP_HIGH = 0.8, 1.2
RL_INPUTS = ("target_tokens", "logprobs", "advantages")
CLIP_INPUTS = ("clip_low_threshold", "clip_high_threshold")
CLIP_CONFIG: dict[str, float | None] = {"clip_low_threshold": DEFAULT_CLIP_LOW, "clip_high_threshold": DEFAULT_CLIP_HIGH}
SEQUENCE_START = "sequence_start"       # a term input (never a datum's): 1 at each datum's first term, else 0


@dataclass(frozen=True)
class LossKind:
    required: tuple[str, ...]
    optional: tuple[str, ...] = ("weights",)
    config: dict[str, float | None] = field(default_factory=dict)     # key -> default (None: required)
    candidates: bool = False                                           # [N, K] targets allowed


LOSSES: dict[str, LossKind] = {
    "cross_entropy": LossKind(("target_tokens",), candidates=True),
    "importance_sampling": LossKind(RL_INPUTS),
    "ppo": LossKind(RL_INPUTS, ("weights", *CLIP_INPUTS), CLIP_CONFIG),
    "cispo": LossKind(RL_INPUTS, ("weights", *CLIP_INPUTS), CLIP_CONFIG),
    "dro": LossKind(RL_INPUTS, config={"beta": None}),
    "gspo": LossKind((*RL_INPUTS, "sequence_ratio_mask"), ("weights", *CLIP_INPUTS), CLIP_CONFIG),
}
REFUSED = {
    "stable_reinforce": "its objective reads the stability information Tinker's sampler records for each sampled "
                        "sequence (record_stability_info=True, named in training by sequence_id); Tinker documents "
                        "neither what that information is nor the objective over it, so Forge neither records it "
                        "nor guesses it (use ppo, cispo, gspo or importance_sampling, or forward_backward_custom)",
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
    if "sequence_ratio_mask" in loss.kind.required and not np.any(np.asarray(datum.inputs["sequence_ratio_mask"])):
        raise UserError(f"{where}: sequence_ratio_mask marks no token: {loss.name}'s sequence ratio is the mean "
                        "log-ratio over the marked tokens (those != 0), undefined over none")
    return 1 if targets.ndim == 1 else int(targets.shape[1])


def term_inputs(loss: Loss, datum: Datum) -> dict[str, np.ndarray]:
    """The datum's per-term inputs, flattened (position-major), with its defaults filled in: weights 1, the
    thresholds from the configuration; and for a sequence-level loss (gspo) ``sequence_start``, which marks the
    datum's first term (``elementwise_loss`` then needs each datum's terms together and in order)."""
    targets = np.asarray(datum.inputs["target_tokens"])
    inputs = {"weights": np.ones(targets.size, dtype=np.float32)}
    if loss.name == "gspo":
        inputs[SEQUENCE_START] = np.zeros(targets.size, dtype=np.float32)
        inputs[SEQUENCE_START][0] = 1.0
    for key in loss.kind.required[1:]:
        inputs[key] = np.asarray(datum.inputs[key], dtype=np.float32).reshape(-1)
    for key in ("weights", *CLIP_INPUTS):
        if key in datum.inputs:
            inputs[key] = np.asarray(datum.inputs[key], dtype=np.float32).reshape(-1)
        elif key in loss.config:
            inputs[key] = np.full(targets.size, loss.config[key], dtype=np.float32)
    return inputs


def elementwise_loss(loss: Loss, logp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    """Each term's loss (its weight applied), differentiable in ``logp`` (the model's log-probabilities). For gspo,
    the terms of every datum present must all be there, together and in order (``sequence_start`` marks where each
    begins), as packed batches give them."""
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
        terms = cispo_terms(logp, old, advantages, 1.0 - inputs["clip_low_threshold"],
                            inputs["clip_high_threshold"] - 1.0)
    elif loss.name == "gspo":
        ratio = gspo_token_ratio(logp, old, inputs["sequence_ratio_mask"], inputs[SEQUENCE_START])
        clipped = torch.clamp(ratio, inputs["clip_low_threshold"], inputs["clip_high_threshold"])
        terms = torch.minimum(ratio * advantages, clipped * advantages)
    elif loss.name == "dro":
        terms = logp * advantages - 0.5 * loss.config["beta"] * (logp - old) ** 2
    else:
        raise UserError(f"unknown loss {loss.name!r}")
    return -terms * weights


def gspo_token_ratio(logp: Tensor, old: Tensor, ratio_mask: Tensor, sequence_start: Tensor) -> Tensor:
    """GSPO-token's per-token ratio s_t = sg(s)·p/sg(p), s the exponential of the mean of log(sg(p)/q) over the
    datum's tokens that ``ratio_mask`` marks (≠ 0); datums are the runs ``sequence_start`` begins."""
    sequence = torch.cumsum(sequence_start != 0, 0) - 1
    size = int(sequence[-1]) + 1 if sequence.numel() else 0
    marked = (ratio_mask != 0).to(logp.dtype)
    log_ratio = (logp.detach() - old).to(logp.dtype) * marked
    sums = logp.new_zeros(size).index_add(0, sequence, log_ratio)
    counts = logp.new_zeros(size).index_add(0, sequence, marked)
    return torch.exp((sums / counts)[sequence] + logp - logp.detach())
