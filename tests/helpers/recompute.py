"""The learner's recomputation of recorded calls: each call's completion log-probabilities under a checkpoint, as
the learner computes them (its samples, micro-batch and forward pass), beside the log-probabilities the actor
recorded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from forge.learner.policy import recompute_logprobs
from forge.learner.samples import Sample, banned_of, make_micro_batch, sampling_of
from forge.model.qwen3 import CausalLM
from forge.v1 import pool_pb2


def learner_and_recorded(checkpoint: Path, calls: Sequence[pool_pb2.CallRecord]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the learner's log-probabilities, the recorded ones) of every completion token of ``calls``."""
    model = CausalLM.from_pretrained(checkpoint).eval()
    samples = []
    for call in calls:
        temperature, top_k, top_p = sampling_of(call)
        min_tokens, banned = banned_of(call, model.config.eos_token_ids)
        samples.append(Sample(tokens=[*call.prompt_ids, *call.completion_ids], prompt_len=len(call.prompt_ids),
                              old_logprobs=list(call.logprobs), versions=list(call.weight_versions), advantage=0.0,
                              temperature=temperature, top_k=top_k, top_p=top_p, domain="", position=0,
                              session_id=call.session_id, call_index=call.index, min_tokens=min_tokens,
                              banned=banned))
    batch = make_micro_batch(samples)
    return recompute_logprobs(model, batch), batch.old_logprobs
