"""One training step on a pool, alone or under torchrun with FSDP2 (and context parallelism of a given size), with
LoRA adapters of a given rank (their B drawn at random, the same on every rank) or without; rank 0 saves the
gradients the step used and the resulting parameters. Arguments: MODEL POOL OUT MICRO_BATCH_TOKENS [LORA_RANK
[CONTEXT_PARALLEL [ACTIVATION_CHECKPOINTING [DEVICE]]]] (DEVICE: cpu, the default, or cuda: a GPU per rank, NCCL)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from gradients import capture_gradients
from lora import randomize_adapters

from forge.checkpoints import load_model
from forge.learner.lora import LoraConfig, add_adapters
from forge.learner.losses import LossConfig
from forge.learner.parallel import full_state_dict, init_distributed, shard_model
from forge.learner.rewards import RewardConfig
from forge.learner.trainer import Trainer, TrainerConfig
from forge.pool import Pool
from forge.pool.window import WindowConfig


def main(model_dir: str, pool_dir: str, out: str, micro_batch_tokens: int, lora_rank: int = 0,
         context_parallel: int = 1, activation_checkpointing: int = 0, device: str = "cpu") -> None:
    distributed = init_distributed(device)
    torch.manual_seed(0)
    model = load_model(model_dir)[0]        # Forge's own family, or transformers'
    lora = LoraConfig(rank=lora_rank, alpha=8.0, publish="adapters") if lora_rank else None
    if lora is not None:
        randomize_adapters(add_adapters(model, lora), seed=1)
    model = shard_model(model, distributed)
    pool = Pool(pool_dir) if distributed.is_main else None
    trainer = Trainer(model, distributed, TrainerConfig(lr=1e-3, micro_batch_tokens=micro_batch_tokens,
                                                        context_parallel=context_parallel,
                                                        activation_checkpointing=bool(activation_checkpointing)),
                      LossConfig(mtp_weight=0.5, mtp_top_k=8), RewardConfig(),
                      WindowConfig(window=16, batch_groups=4), pool, lora=lora)
    grads = capture_gradients(trainer, model)
    record = trainer.step()
    state = full_state_dict(model, distributed)
    published = trainer.published() if lora is not None else {}
    if distributed.is_main:
        torch.save({"state": state, "published": published, "grads": grads, "loss": record["loss"],
                    "tokens": record["tokens"], "stem_tokens": record.get("stem_tokens", 0),
                    "packed_tokens": record["packed_tokens"], "stem_rank_tokens": record["stem_rank_tokens"]}, out)
        pool.close()
    distributed.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *map(int, sys.argv[5:8]), *sys.argv[8:9])
    Path(sys.argv[3] + ".done").touch()
