"""The learner's log-probabilities of recorded calls: each call made into the sample the learner would train on
(``call_sample``: its sampling, edits and routing as the actor applied them), packed into micro-batches and passed
through the learner's forward pass (``recompute_logprobs``), so that exp(learner − recorded) is the importance ratio
the learner would weigh each completion token by."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from forge.learner.policy import recompute_logprobs
from forge.learner.samples import Sample, call_sample, make_micro_batch, micro_batches
from forge.model.policy import Policy
from forge.sampling.grammar import Grammars
from forge.v1 import pool_pb2

TOKEN_BUDGET = 16_384       # padded tokens of one forward pass


class Unreplayable(ValueError):
    """A call whose sampling cannot be replayed (the learner leaves it out of training)."""


def learner_logprobs(model: Policy, calls: Sequence[pool_pb2.CallRecord], grammars: Grammars | None = None,
                     token_budget: int = TOKEN_BUDGET) -> list[Tensor | None]:
    """Per call of ``calls``, the log-probabilities ``model`` gives its completion tokens as the learner computes
    them (float32, on the CPU); None for a call the learner would leave out because its edits cannot be rebuilt. A
    call without completion tokens gets an empty tensor."""
    eos = tuple(model.config.eos_token_ids)
    out: list[Tensor | None] = [torch.zeros(0) for _ in calls]
    samples: dict[int, Sample] = {}
    for i, call in enumerate(calls):
        if not call.completion_ids:
            continue
        try:
            samples[i] = call_sample(call, eos, grammars)
        except ValueError:
            out[i] = None
    if not samples:
        return out
    device = next(iter(model.parameters())).device if isinstance(model, torch.nn.Module) else "cpu"
    index_of = {id(sample): i for i, sample in samples.items()}
    for group in micro_batches(list(samples.values()), token_budget):
        batch = make_micro_batch(group, device)
        values = recompute_logprobs(model, batch).float().cpu()
        for sample, part in zip(group, values.split([s.num_completion for s in group]), strict=True):
            out[index_of[id(sample)]] = part
    return out


def learner_and_recorded(model: Policy, calls: Sequence[pool_pb2.CallRecord], grammars: Grammars | None = None
                         ) -> tuple[Tensor, Tensor]:
    """(the learner's log-probabilities, the recorded ones) of every completion token of ``calls``, in call order;
    Unreplayable if a call's edits cannot be rebuilt."""
    learner = learner_logprobs(model, calls, grammars)
    for call, values in zip(calls, learner, strict=True):
        if values is None:
            raise Unreplayable(f"call {call.index} of session {call.session_id}: its sampling cannot be replayed")
    recorded = [lp for call in calls for lp in call.logprobs]
    return torch.cat([v for v in learner if v is not None]), torch.tensor(recorded, dtype=torch.float32)
