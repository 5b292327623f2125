"""The training–inference mismatch: measured every step, and corrected on request.

The actor records log μ(y_t), the log-prob its engine gave each sampled token at weight version v_t; the learner
computes log π_L(y_t), the *learner's side*: at v_t itself where the learner holds that version's weights (the
current version; with ``--recompute-behaviour`` the previous one too, ``PreviousVersion``), else at its current
version (then the figure includes the policy's drift since v_t: ``mismatch_current_frac`` is the share of tokens so
measured). With w_t = π_L(y_t) / μ(y_t):

- metrics (``MismatchTally``), overall and per domain: ``mismatch_kl`` the mean of k3 = w − 1 − log w (an estimate
  of KL(μ ‖ π_L), the tokens being μ's samples), ``mismatch_abs_logp`` the mean |log w|, ``mismatch_outside`` the
  share of tokens with w outside [0.5, 2];
- corrections (``correction_weights``), off by default, each a detached weight c_t on a token's loss term, the
  policy loss then taking its ratio against π_L rather than μ (the decoupled form the references use: the loss's
  ratio measures the update, c_t the mismatch):
  truncated IS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):
  c = min(w, C), or at the sequence level min(Π_t w_t, C); masked IS (Liu et al. 2025, "When speed kills
  stability"): c = w · 1[w ≤ C], or the sequence's Π_t w_t · 1[Π_t w_t ≤ C]; IcePop (Ring-1T, arXiv:2510.18855):
  c = w · 1[α ≤ w ≤ β]. A dropped token keeps its place in the loss's denominators, as in those objectives.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from forge.learner.loss_config import LossConfig

OUTSIDE = (math.log(0.5), math.log(2.0))       # the ratio band outside which a token counts as mismatched


def _sequence_sums(values: Tensor, sample_index: Tensor) -> Tensor:
    size = int(sample_index.max()) + 1 if sample_index.numel() else 0
    return torch.zeros(size, dtype=values.dtype, device=values.device).index_add(0, sample_index, values)


def correction_weights(config: LossConfig, learner_logp: Tensor, behaviour_logp: Tensor, mask: Tensor,
                       sample_index: Tensor) -> Tensor:
    """Each token's correction weight c_t (detached; ones with ``correction = "none"``). A sequence's log w is
    the sum over its trained tokens (``mask``)."""
    log_w = (learner_logp - behaviour_logp).detach().double()
    kind = config.correction
    if kind == "none":
        return torch.ones_like(learner_logp)
    if kind == "icepop":
        weight = torch.exp(log_w)
        keep = (weight >= config.icepop_low) & (weight <= config.icepop_high)
        return torch.where(keep, weight, 0.0).to(learner_logp.dtype)
    if config.correction_level == "sequence":
        log_w = _sequence_sums(log_w * mask.double(), sample_index)[sample_index]
    if kind == "tis":
        return torch.exp(log_w.clamp(max=math.log(config.tis_cap))).to(learner_logp.dtype)
    if kind == "mis":
        return torch.where(log_w <= math.log(config.mis_cap), torch.exp(log_w), 0.0).to(learner_logp.dtype)
    raise ValueError(f"unknown correction {kind!r}: none, tis, mis or icepop")


def corrected(config: LossConfig, learner_logp: Tensor, behaviour_logp: Tensor, advantages: Tensor, mask: Tensor,
              sample_index: Tensor) -> tuple[Tensor, Tensor]:
    """(the behaviour log-probs, the advantages) the policy loss takes: unchanged without a correction; with one,
    the learner's side and c_t · Â_t. Every loss is positively homogeneous in each token's advantage (min(r c Â,
    clip(r) c Â) = c · min(r Â, clip(r) Â) for c ≥ 0), so weighing the advantage weighs the token's term."""
    if config.correction == "none":
        return behaviour_logp, advantages
    weights = correction_weights(config, learner_logp, behaviour_logp, mask, sample_index)
    return learner_logp.detach(), advantages * weights


def token_versions(samples: Sequence, count: int, default: int) -> Tensor:
    """The sampling version of each term of a micro-batch (its samples' completion tokens in order); a sample
    without one version per token counts as ``default``'s."""
    versions: list[int] = []
    for sample in samples:
        own = list(sample.versions)
        versions += own if len(own) == sample.num_completion else [default] * sample.num_completion
    if len(versions) != count:
        raise ValueError(f"{len(versions)} token versions for {count} terms")
    return torch.tensor(versions, dtype=torch.long)


class PreviousVersion:
    """The trainable weights of the version before the current one (kept just before each optimizer step), so that
    tokens sampled at it are measured against the learner at their own version. With LoRA they are the adapters
    (and the MTP draft); in full fine-tuning a copy of the model's weights (this rank's shards under FSDP2)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.tensors: list[Tensor] = []

    def keep(self, model: nn.Module, version: int) -> None:
        with torch.no_grad():
            self.tensors = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        self.version = version

    @contextmanager
    def held(self, model: nn.Module) -> Iterator[None]:
        """``model`` runs with the kept weights inside the block (swapped in place, one parameter's copy at a
        time, and back)."""
        params = [p for p in model.parameters() if p.requires_grad]
        if len(params) != len(self.tensors):
            raise RuntimeError("the kept version has other trainable parameters than the model")
        _swap(params, self.tensors)
        try:
            yield
        finally:
            _swap(params, self.tensors)


@torch.no_grad()
def _swap(params: list[Tensor], kept: list[Tensor]) -> None:
    for param, other in zip(params, kept, strict=True):
        current = param.detach().clone()
        param.copy_(other)
        other.copy_(current)


class MismatchTally:
    """Sums, per domain, of the mismatch figures of the step's terms; ``figures`` turns them (summed over ranks)
    into the step's metrics."""

    KEYS = ("count", "kl", "abs_logp", "outside", "current")

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(self.KEYS, 0.0))

    def add(self, learner_logp: Tensor, behaviour_logp: Tensor, domains: Sequence[str], sample_index: Tensor,
            current: Tensor, weight: float = 1.0) -> None:
        """A micro-batch's terms: ``domains`` per sample, ``current`` per term whether its learner side is the
        current policy at a version other than its own; ``weight`` scales the sums (a context group's share)."""
        log_w = (learner_logp.detach() - behaviour_logp).double().cpu()
        index = sample_index.cpu()
        values = {"count": torch.ones_like(log_w), "kl": torch.exp(log_w) - 1.0 - log_w, "abs_logp": log_w.abs(),
                  "outside": ((log_w < OUTSIDE[0]) | (log_w > OUTSIDE[1])).double(), "current": current.double().cpu()}
        names = sorted({domain or "default" for domain in domains})
        of_sample = torch.tensor([names.index(domain or "default") for domain in domains], dtype=torch.long)
        of_term = of_sample[index] if index.numel() else index
        for number, name in enumerate(names):
            rows = of_term == number
            if not bool(rows.any()):
                continue
            sums = self.sums[name]
            for key, value in values.items():
                sums[key] += float(value[rows].sum()) * weight

    def keys(self, domains: Sequence[str]) -> list[tuple[str, str]]:
        """Every (domain, figure) of ``domains`` (the same on every rank: the collectives run in this order)."""
        return [(domain or "default", key) for domain in sorted({d or "default" for d in domains}) for key in self.KEYS]

    def figures(self, totals: dict[tuple[str, str], float]) -> dict[str, float]:
        """The step's metrics from the ranks' summed ``totals``: overall and ``/domain``."""
        overall = dict.fromkeys(self.KEYS, 0.0)
        per_domain: dict[str, dict[str, float]] = defaultdict(dict)
        for (domain, key), value in totals.items():
            per_domain[domain][key] = value
            overall[key] += value
        out = _means(overall, "")
        for domain, sums in sorted(per_domain.items()):
            out |= _means(sums, f"/{domain}")
        return out


def _means(sums: dict[str, float], suffix: str) -> dict[str, float]:
    count = max(1.0, sums["count"])
    out = {f"mismatch_{key}{suffix}": sums[key] / count for key in ("kl", "abs_logp", "outside")}
    if not suffix:
        out["mismatch_current_frac"] = sums["current"] / count
    return out
