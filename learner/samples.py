"""Training samples: one per recorded LLM call (prompt ids + completion ids, behaviour log-probs, advantage,
sampling parameters), and their packing into padded micro-batches under a token budget."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge import expert_routing
from forge.learner.rewards import SessionRewards
from forge.sampling.grammar import Grammars
from forge.sampling.logit_edits import LogitEdits, call_edits
from forge.sampling.wire import sampling_from_proto
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)


@dataclass
class Sample:
    tokens: list[int]               # prompt followed by completion
    prompt_len: int
    old_logprobs: list[float]       # one per completion token
    versions: list[int]             # weight version of each completion token
    advantage: float
    temperature: float
    top_k: int
    top_p: float
    domain: str
    position: int                   # queue entry the call belongs to
    session_id: str
    call_index: int
    edits: LogitEdits | None = None     # the actor's edits of each completion token's logits, by token index
    routing: np.ndarray | None = None   # a model with experts: the actor's routing of tokens[:-1] (see expert_routing)
    token_advantages: list[float] | None = None   # one per completion token, in place of ``advantage`` (distillation)

    @property
    def num_completion(self) -> int:
        return len(self.tokens) - self.prompt_len

    def completion_advantages(self) -> list[float]:
        """The advantage of each completion token."""
        if self.token_advantages is not None:
            return self.token_advantages
        return [self.advantage] * self.num_completion


def sampling_of(call: pool_pb2.CallRecord) -> tuple[float, int, float]:
    """The (temperature, top_k, top_p) the actor applied: unset temperature = 1, 0 = greedy (log-probs at T = 1)."""
    params = call.sampling
    temperature = params.temperature if params.HasField("temperature") else 1.0
    return temperature, params.top_k, params.top_p or 1.0


def edits_of(call: pool_pb2.CallRecord, eos_token_ids: tuple[int, ...], grammars: Grammars | None = None
             ) -> LogitEdits | None:
    """The edits the actor made to the logits of each completion token of ``call`` (min_tokens, its grammar replayed
    over the completion, logit_bias, penalties), rebuilt from the recorded call; ValueError if they cannot be."""
    edits = call_edits(sampling_from_proto(call.sampling), call.prompt_ids, eos_token_ids, grammars)
    return None if edits is None else LogitEdits.of_rows(edits.rows(call.completion_ids))


def call_sample(call: pool_pb2.CallRecord, eos_token_ids: tuple[int, ...] = (), grammars: Grammars | None = None,
                advantage: float = 0.0, domain: str = "", position: int = 0) -> Sample:
    """``call`` as the learner trains on it: its tokens, behaviour log-probs and versions, the sampling it was drawn
    with, its edits rebuilt (``edits_of``: ValueError if they cannot be) and a model with experts' routing."""
    temperature, top_k, top_p = sampling_of(call)
    return Sample(
        tokens=[*call.prompt_ids, *call.completion_ids], prompt_len=len(call.prompt_ids),
        old_logprobs=list(call.logprobs), versions=list(call.weight_versions), advantage=advantage,
        temperature=temperature, top_k=top_k, top_p=top_p, domain=domain, position=position,
        session_id=call.session_id, call_index=call.index, edits=edits_of(call, eos_token_ids, grammars),
        routing=expert_routing.decode(call.routed_experts) if call.HasField("routed_experts") else None)


def build_samples(entries: list[pool_pb2.QueueEntry], rewards: list[SessionRewards],
                  eos_token_ids: tuple[int, ...] = (), grammars: Grammars | None = None) -> list[Sample]:
    """One sample per recorded call; ``eos_token_ids`` are the model's (what ``min_tokens`` kept out too),
    ``grammars`` compile the structured-output calls' grammars. A call whose edits cannot be rebuilt (a grammar its
    completion does not follow) is left out, with a warning."""
    by_session = {r.session_id: r for r in rewards}
    samples = []
    for entry in entries:
        for item in entry.sessions:
            reward = by_session[item.session.session_id]
            for call in sorted(item.calls, key=lambda c: c.index):
                if not call.completion_ids:
                    continue
                try:
                    samples.append(call_sample(
                        call, eos_token_ids, grammars,
                        advantage=reward.advantages[call.index] if call.index < len(reward.advantages) else 0.0,
                        domain=item.session.domain, position=entry.position))
                except ValueError as exc:
                    log.warning("call %d of session %s is left out: its sampling cannot be replayed (%s)",
                                call.index, call.session_id, exc)
    return samples


@dataclass
class MicroBatch:
    """Padded token ids [B, L] and, flattened over the completion tokens of every row, what the losses need."""

    input_ids: Tensor           # [B, L]
    rows: Tensor                # [N] row of each completion token
    positions: Tensor           # [N] position whose logits predict it (its own position - 1)
    targets: Tensor             # [N] the token
    old_logprobs: Tensor        # [N]
    advantages: Tensor          # [N]
    temperature: Tensor         # [N]
    top_k: Tensor               # [N]
    top_p: Tensor               # [N]
    sample_index: Tensor        # [N] index of the sample within this micro-batch
    samples: list[Sample]
    edits: LogitEdits | None = None     # edits of the terms' logits (rows: terms)
    valid: Tensor | None = None     # [B * L] which of the flattened positions are tokens (not padding)
    routing: Tensor | None = None   # [layers, B * L, top_k] recorded expert ids of each position (-1: none)

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())


def make_micro_batch(samples: list[Sample], device: torch.device | str = "cpu") -> MicroBatch:
    width = max(len(s.tokens) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    rows, positions, targets, old, adv, temp, top_k, top_p, index = ([] for _ in range(9))
    edits = []
    for row, sample in enumerate(samples):
        if sample.edits is not None:
            edits.append(sample.edits.shifted(len(targets)))
        ids[row, :len(sample.tokens)] = torch.tensor(sample.tokens)
        count = sample.num_completion
        rows += [row] * count
        positions += range(sample.prompt_len - 1, len(sample.tokens) - 1)
        targets += sample.tokens[sample.prompt_len:]
        old += sample.old_logprobs
        adv += sample.completion_advantages()
        temp += [sample.temperature] * count
        top_k += [sample.top_k] * count
        top_p += [sample.top_p] * count
        index += [row] * count

    def tensor(values, dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    lengths = torch.tensor([len(s.tokens) for s in samples])
    valid = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).reshape(-1)
    return MicroBatch(ids.to(device), tensor(rows, torch.long), tensor(positions, torch.long),
                      tensor(targets, torch.long), tensor(old, torch.float32), tensor(adv, torch.float32),
                      tensor(temp, torch.float32), tensor(top_k, torch.long), tensor(top_p, torch.float32),
                      tensor(index, torch.long), samples,
                      LogitEdits.concat(edits),
                      valid.to(device), padded_routing(samples, width, device))


def padded_routing(samples: list[Sample], width: int, device: torch.device | str) -> Tensor | None:
    """The samples' recorded routing as [layers, rows * width, top_k] (-1 for padding and unrecorded positions);
    None when no sample has one."""
    shape = next((s.routing.shape[1:] for s in samples if s.routing is not None), None)
    if shape is None:
        return None
    out = np.full((len(samples), width, *shape), -1, dtype=np.int32)
    for row, sample in enumerate(samples):
        if sample.routing is not None:
            out[row, :len(sample.routing)] = sample.routing
    return torch.from_numpy(out.reshape(len(samples) * width, *shape)).transpose(0, 1).to(device)


def micro_batches(samples: list[Sample], token_budget: int) -> Iterator[list[Sample]]:
    """Groups of samples whose padded size (rows × longest row) stays within ``token_budget`` (a longer sample gets
    a micro-batch of its own), longest first so padding stays small."""
    batch: list[Sample] = []
    width = 0
    for sample in sorted(samples, key=lambda s: len(s.tokens), reverse=True):
        new_width = max(width, len(sample.tokens))
        if batch and new_width * (len(batch) + 1) > token_budget:
            yield batch
            batch, new_width = [], len(sample.tokens)
        batch.append(sample)
        width = new_width
    if batch:
        yield batch
