"""Training samples: one per recorded LLM call (prompt ids + completion ids, behaviour log-probs, advantage,
sampling parameters), and their packing into padded micro-batches under a token budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

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
                    min_tokens=min_tokens, banned=banned))
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

    return MicroBatch(ids.to(device), tensor(rows, torch.long), tensor(positions, torch.long),
                      tensor(targets, torch.long), tensor(old, torch.float32), tensor(adv, torch.float32),
                      tensor(temp, torch.float32), tensor(top_k, torch.long), tensor(top_p, torch.float32),
                      tensor(index, torch.long), samples,
                      (tensor(banned_terms, torch.long), tensor(banned_ids, torch.long)) if banned_terms else None)


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
