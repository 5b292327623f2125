"""Run under torchrun (two ranks, gloo): the Tinker training of forge-tinker --nproc on every rank, driven in-process
as the server drives it (rank 0's ``RankedTraining``, the other ranks following): a model trained a step on data
sharing prefixes, its sampler weights saved, then prompt log-probabilities (with top-k) under the base and under the
sampler's weights, which run the sharded base's forward on every rank. Rank 0 then takes the same calls on one
process (``LearnerTraining``) and writes both answers to OUT (JSON). Arguments: WORK_DIR OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from forge.learner.parallel import init_distributed
from forge.learner.tinker.ranks import RankedTraining, RankTraining, follow
from forge.learner.tinker.training import LearnerTraining
from forge.learner.tinker.types import AdamSpec, Datum, LoraSpec, Training

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]


def calls(training: Training) -> dict[str, object]:
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 1000, 9)
    data = []
    for length in (3, 5, 4):
        sequence = np.concatenate([shared, rng.integers(0, 1000, length)])
        data.append(Datum(sequence[:-1], {"target_tokens": sequence[1:],
                                          "weights": np.ones(len(sequence) - 1, dtype=np.float32)}))
    model_id = training.create_model("alice", "tiny", LoraSpec(rank=4, seed=5)).model_id
    training.forward(model_id, data, "cross_entropy", None, True)
    training.optim_step(model_id, AdamSpec(learning_rate=0.05))
    path = training.save_sampler(model_id, "s").path
    base, _ = training.prompt_logprobs("tiny", None, PROMPT)
    tuned, top = training.prompt_logprobs("tiny", path, PROMPT, top_k=3)
    return {"base": base[1:], "tuned": tuned[1:], "top": [[list(pair) for pair in row] for row in top[1:]]}


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    distributed = init_distributed("cpu", timeout_s=120)
    training = RankTraining(work / "ranks", distributed, token_budget=8)
    if not distributed.is_main:
        follow(training)
        distributed.close()
        return
    ranked = RankedTraining(training)
    answers = {"ranks": calls(ranked)}
    ranked.close()
    answers["one"] = calls(LearnerTraining(work / "one", token_budget=8))
    out.write_text(json.dumps(answers))


if __name__ == "__main__":
    main()
