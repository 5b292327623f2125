"""Training samples: one per recorded LLM call (prompt ids + completion ids, behaviour log-probs, advantage,
sampling parameters), and their packing into padded micro-batches under a token budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge import expert_routing
from forge.learner.rewards import SessionRewards
from forge.v1 import pool_pb2


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
    min_tokens: int = 0             # the first min_tokens completion tokens were drawn without ``banned``
    banned: tuple[int, ...] = ()    # the call's stop ids and the model's end-of-sequence ids
    routing: np.ndarray | None = None   # a model with experts: the actor's routing of tokens[:-1] (see expert_routing)

    @property
    def num_completion(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_banned(self) -> int:
        """Completion tokens (the first ones) drawn with ``banned`` left out of the distribution."""
        return min(self.min_tokens, self.num_completion) if self.banned else 0


def sampling_of(call: pool_pb2.CallRecord) -> tuple[float, int, float]:
    """The (temperature, top_k, top_p) the actor applied: unset temperature = 1, 0 = greedy (log-probs at T = 1)."""
    params = call.sampling
    temperature = params.temperature if params.HasField("temperature") else 1.0
    return temperature, params.top_k, params.top_p or 1.0


def banned_of(call: pool_pb2.CallRecord, eos_token_ids: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(min_tokens, the ids it kept out of the first tokens' distribution) of a call, as the actor applied them:
    its stop ids and the end-of-sequence ids, ignore_eos or not (as vLLM does)."""
    params = call.sampling
    if params.min_tokens <= 0:
        return 0, ()
    return params.min_tokens, tuple(sorted(set(params.stop_token_ids) | set(eos_token_ids)))


def build_samples(entries: list[pool_pb2.QueueEntry], rewards: list[SessionRewards],
                  eos_token_ids: tuple[int, ...] = ()) -> list[Sample]:
    """One sample per recorded call; ``eos_token_ids`` are the model's (what ``min_tokens`` kept out too)."""
    by_session = {r.session_id: r for r in rewards}
    samples = []
    for entry in entries:
        for item in entry.sessions:
            reward = by_session[item.session.session_id]
            for call in sorted(item.calls, key=lambda c: c.index):
                if not call.completion_ids:
                    continue
                temperature, top_k, top_p = sampling_of(call)
                min_tokens, banned = banned_of(call, eos_token_ids)
                samples.append(Sample(
                    tokens=[*call.prompt_ids, *call.completion_ids], prompt_len=len(call.prompt_ids),
                    old_logprobs=list(call.logprobs), versions=list(call.weight_versions),
                    advantage=reward.advantages[call.index] if call.index < len(reward.advantages) else 0.0,
                    temperature=temperature, top_k=top_k, top_p=top_p, domain=item.session.domain,
                    position=entry.position, session_id=item.session.session_id, call_index=call.index,
                    min_tokens=min_tokens, banned=banned,
                    routing=expert_routing.decode(call.routed_experts) if call.HasField("routed_experts") else None))
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
    banned: tuple[Tensor, Tensor] | None = None     # (term, token id) pairs left out of the term's distribution
    valid: Tensor | None = None     # [B * L] which of the flattened positions are tokens (not padding)
    routing: Tensor | None = None   # [layers, B * L, top_k] recorded expert ids of each position (-1: none)

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())


def make_micro_batch(samples: list[Sample], device: torch.device | str = "cpu") -> MicroBatch:
    width = max(len(s.tokens) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    rows, positions, targets, old, adv, temp, top_k, top_p, index = ([] for _ in range(9))
    banned_terms: list[int] = []
    banned_ids: list[int] = []
    for row, sample in enumerate(samples):
        for term in range(len(targets), len(targets) + sample.num_banned):
            banned_terms += [term] * len(sample.banned)
            banned_ids += sample.banned
        ids[row, :len(sample.tokens)] = torch.tensor(sample.tokens)
        count = sample.num_completion
        rows += [row] * count
        positions += range(sample.prompt_len - 1, len(sample.tokens) - 1)
        targets += sample.tokens[sample.prompt_len:]
        old += sample.old_logprobs
        adv += [sample.advantage] * count
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
                      (tensor(banned_terms, torch.long), tensor(banned_ids, torch.long)) if banned_terms else None,
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
