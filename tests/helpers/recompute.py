"""The learner's recomputation of recorded calls: each call's completion log-probabilities under a checkpoint, as
the learner computes them (its samples, micro-batch and forward pass), beside the log-probabilities the actor
recorded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from forge.learner.policy import recompute_logprobs
from forge.learner.samples import Sample, edits_of, make_micro_batch, sampling_of
from forge.model.qwen3 import CausalLM
from forge.sampling.grammar import Grammars
from forge.v1 import pool_pb2


def learner_and_recorded(checkpoint: Path, calls: Sequence[pool_pb2.CallRecord]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the learner's log-probabilities, the recorded ones) of every completion token of ``calls``; their edits
    (min_tokens, grammar, logit_bias, penalties) rebuilt as the learner does, grammars from the checkpoint's
    tokenizer."""
    model = CausalLM.from_pretrained(checkpoint).eval()
    config = model.config
    grammars = Grammars(checkpoint, config.vocab_size, tuple(config.eos_token_ids))
    samples = []
    for call in calls:
        temperature, top_k, top_p = sampling_of(call)
        samples.append(Sample(tokens=[*call.prompt_ids, *call.completion_ids], prompt_len=len(call.prompt_ids),
                              old_logprobs=list(call.logprobs), versions=list(call.weight_versions), advantage=0.0,
                              temperature=temperature, top_k=top_k, top_p=top_p, domain="", position=0,
                              session_id=call.session_id, call_index=call.index,
                              edits=edits_of(call, tuple(config.eos_token_ids), grammars)))
    batch = make_micro_batch(samples)
    return recompute_logprobs(model, batch), batch.old_logprobs
