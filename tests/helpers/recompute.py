"""The learner's recomputation of recorded calls: each call's completion log-probabilities under a checkpoint, as
the learner computes them (``forge.learner.recompute``: its samples, micro-batches and forward pass), beside the
log-probabilities the actor recorded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from forge.learner import recompute
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
    return recompute.learner_and_recorded(model, calls, grammars)
