"""What a learner step carries: the trainer's position (step, weight version, pool sequence, positions trained since
the last checkpoint), what a step's micro-batches share and add up (``StepPasses``), the placeholder sample that keeps
ranks' collectives in step, and the optimizer state's size."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from forge.learner.corrections import MismatchTally
from forge.learner.expert_replay import RoutingTally
from forge.learner.loss_config import LossConfig
from forge.learner.samples import Sample


@dataclass
class TrainerState:
    step: int = 0
    version: int = 0                    # weight version of the current parameters; grows by one per step and
                                        # never repeats across restarts (see restore)
    pool_seq: int = 0
    trained_positions: list[int] = field(default_factory=list)   # entries trained since the last checkpoint


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The memory this rank's optimizer state holds (its shard, under FSDP2)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.numel() * local.element_size()
    return total


@dataclass
class StepPasses:
    """What a step's micro-batches share (global counts, weights) and accumulate (losses, figures, tallies)."""

    samples: list[Sample]
    config: Any                         # the model's
    loss: LossConfig
    routing: str
    share: float = 1.0                  # this rank's share of a context group's trees
    computed: float = 1.0               # tokens the step computes, over every rank (the balance loss's weights)
    policy_sum: float = 0.0
    mtp_sum: float = 0.0
    kl_sum: float = 0.0
    figures: list[dict[str, float]] = field(default_factory=list)
    mismatch: MismatchTally = field(default_factory=MismatchTally)

    def __post_init__(self) -> None:
        samples = self.samples
        self.tokens = max(1.0, float(sum(s.num_completion for s in samples)))
        self.sequences = max(1.0, float(len(samples)))
        self.mtp_tokens = max(1.0, float(sum(s.num_completion - (s.prompt_len == 1) for s in samples)))
        self.mtp_k = self.loss.mtp_top_k if self.loss.mtp_weight > 0 else 0
        self.tally = RoutingTally(self.config.num_experts, self.config.num_experts_per_tok)
        self.balance = self.loss.router_balance_weight if self.config.sparse_layers else 0.0


def dummy_sample() -> Sample:
    """A one-token sample whose loss is multiplied by zero: keeps FSDP collectives in step across ranks."""
    return Sample([0, 0], 1, [0.0], [0], 0.0, 1.0, 0, 1.0, "", -1, "", 0)
