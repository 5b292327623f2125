"""One training step per case on a pool, alone or under torchrun with FSDP2 (and context parallelism of a given
size), with LoRA adapters of a given rank (their B drawn at random, the same on every rank) or without; rank 0 saves
the gradients each step used and the resulting parameters. The cases run one after another in the same processes
(one job, one process group: the start-up of torch and of the job is paid once), each from a fresh seed, model,
trainer and context groups. Arguments: CASES [DEVICE], CASES a JSON file of a list of cases, each {"model", "pool",
"out", "micro_batch_tokens", "lora_rank", "context_parallel", "activation_checkpointing", "loss" (LossConfig's
fields)}; DEVICE: cpu, the default,
or cuda (a GPU per rank, NCCL)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from gradients import capture_gradients
from lora import randomize_adapters

from forge.checkpoints import load_model
from forge.learner.lora import LoraConfig, add_adapters
from forge.learner.losses import LossConfig
from forge.learner.parallel import Distributed, full_state_dict, init_distributed, shard_model
from forge.learner.rewards import RewardConfig
from forge.learner.trainer import Trainer, TrainerConfig
from forge.pool import Pool
from forge.pool.window import WindowConfig


def step(distributed: Distributed, model: str, pool: str, out: str, micro_batch_tokens: int, lora_rank: int = 0,
         context_parallel: int = 1, activation_checkpointing: bool = False, loss: dict | None = None) -> None:
    torch.manual_seed(0)
    network = load_model(model)[0]          # Forge's own family, or transformers'
    lora = LoraConfig(rank=lora_rank, alpha=8.0, publish="adapters") if lora_rank else None
    if lora is not None:
        randomize_adapters(add_adapters(network, lora), seed=1)
    network = shard_model(network, distributed)
    rollouts = Pool(pool) if distributed.is_main else None
    trainer = Trainer(network, distributed, TrainerConfig(lr=1e-3, micro_batch_tokens=micro_batch_tokens,
                                                          context_parallel=context_parallel,
                                                          activation_checkpointing=activation_checkpointing),
                      LossConfig(mtp_weight=0.5, mtp_top_k=8, **(loss or {})), RewardConfig(),
                      WindowConfig(window=16, batch_groups=4), rollouts, lora=lora)
    grads = capture_gradients(trainer, network)
    record = trainer.step()
    state = full_state_dict(network, distributed)
    published = trainer.published() if lora is not None else {}
    if distributed.is_main:
        torch.save({"state": state, "published": published, "grads": grads, "loss": record["loss"],
                    "tokens": record["tokens"], "stem_tokens": record.get("stem_tokens", 0),
                    "packed_tokens": record["packed_tokens"], "stem_rank_tokens": record["stem_rank_tokens"]}, out)
        rollouts.close()


def main(cases: str, device: str = "cpu") -> None:
    distributed = init_distributed(device)
    for case in json.loads(Path(cases).read_text()):
        step(distributed, **case)
    distributed.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
