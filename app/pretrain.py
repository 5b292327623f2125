"""Pre-training of the built-in models on demonstrations of the built-in tasks, so that RL starts from a low but
non-zero success rate: the demonstrations are right only part of the time (a noisy teacher), and training is
short. The loss is next-token cross-entropy on the assistant's tokens only, plus the MTP draft's loss on the token
after next, plus (``tiny-moe``) the routers' load-balancing loss, which keeps every expert in use.
``python -m forge.app.pretrain --model tiny|tiny-moe`` rebuilds the shipped checkpoint."""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from forge.checkpoints import BUILTIN_MODELS, builtin_model, resolve_model, tiny_tokenizer
from forge.cli.options import settings_command
from forge.model.moe import Routing, load_balancing_loss
from forge.rollout.tasks.demonstrations import demonstration
from forge.settings import Settings, setting
from forge.tokenizer import Tokenizer

log = logging.getLogger("forge.pretrain")
MIX = ("reasoning", "qa", "agent", "qa")    # reading the asked fact off the table is the slowest skill to form


def tokenize(tokenizer: Tokenizer, messages: list[dict], tools: list | None) -> tuple[list[int], list[int]] | None:
    """Token ids of the whole conversation and a 0/1 mask of the tokens the assistant generates (its replies up to
    and including the end-of-turn token), found by rendering each reply's prompt with the generation prompt."""
    ids = tokenizer.apply_chat_template(messages, tools=tools)
    mask = [0] * len(ids)
    end = tokenizer.eos_token_id
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:index], tools=tools, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[:index + 1], tools=tools)
        if ids[:len(upto)] != upto or upto[:len(prompt)] != prompt:
            return None                     # a tokenisation boundary moved: skip this demonstration
        reply_end = next((i for i in range(len(prompt), len(upto)) if upto[i] == end), len(upto) - 1)
        for position in range(len(prompt), reply_end + 1):
            mask[position] = 1
    return ids, mask


def batches(tokenizer: Tokenizer, size: int, seed: int):
    rng = random.Random(seed)
    index = 0
    while True:
        rows = []
        while len(rows) < size:
            domain = MIX[index % len(MIX)]
            tokenized = tokenize(tokenizer, *demonstration(domain, rng, index))
            index += 1
            if tokenized is not None:
                rows.append(tokenized)
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros(size, width, dtype=torch.long)
        mask = torch.zeros(size, width)
        for row, (tokens, marks) in enumerate(rows):
            ids[row, :len(tokens)] = torch.tensor(tokens)
            mask[row, :len(marks)] = torch.tensor(marks, dtype=torch.float32)
        yield ids, mask


BALANCE_WEIGHT = 0.01          # the load-balancing loss's weight (1 at a uniform load)


def losses(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(next-token loss, draft loss, load-balancing loss: 0 for a dense model)."""
    routing = Routing(keep_logits=True)
    hidden = model(ids, routing=routing)
    logits = model.logits(hidden[:, :-1])
    target_mask = mask[:, 1:]
    main = (F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none") * target_mask).sum()
    main = main / target_mask.sum().clamp(min=1)
    draft_hidden = model.mtp_forward(hidden[:, :-2], ids[:, 1:-1])
    draft_logits = model.mtp_logits(draft_hidden)
    draft_mask = mask[:, 2:]
    draft = (F.cross_entropy(draft_logits.transpose(1, 2), ids[:, 2:], reduction="none") * draft_mask).sum()
    balance = load_balancing_loss(routing.logits, model.config.num_experts_per_tok) if routing.logits \
        else torch.zeros(())
    return main, draft / draft_mask.sum().clamp(min=1), balance


def pretrain(steps: int, batch_size: int, lr: float, seed: int, progress: bool = True, name: str = "tiny"):
    torch.manual_seed(seed)
    model = builtin_model(name, seed)
    tokenizer = tiny_tokenizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    stream = batches(tokenizer, batch_size, seed)
    started = time.perf_counter()
    model.train()
    for step in range(steps):
        ids, mask = next(stream)
        main, draft, balance = losses(model, ids, mask)
        (main + 0.3 * draft + BALANCE_WEIGHT * balance).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if progress and (step % 100 == 0 or step == steps - 1):
            log.info("step %d/%d  loss %.3f  draft %.3f  balance %.3f  lr %.2e  %.0fs", step + 1, steps, main.item(),
                     draft.item(), balance.item(), scheduler.get_last_lr()[0], time.perf_counter() - started)
    return model.eval()


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(Settings):
    name: str = setting("tiny", flag="model", choices=tuple(sorted(BUILTIN_MODELS)),
                        help="The built-in model to pre-train.")
    out: Path | None = setting(None, path="dir", help="Where to save it [default: the model's asset directory, "
                                                      "forge/assets/MODEL].")
    steps: int = setting(3600, min=1, help="Optimiser steps.")
    batch_size: int = setting(16, min=1, help="Demonstrations per step.")
    lr: float = setting(3e-3, min=0, min_open=True, help="Peak learning rate (AdamW, cosine decay).")
    seed: int = setting(0, help="Seed of the initial weights and the demonstrations.")
    threads: int = setting(0, min=0, help="Torch threads (0: every core).")


@settings_command("pretrain", PretrainConfig)
def main(config: PretrainConfig) -> None:
    """Pre-train a built-in model on noisy demonstrations of the built-in tasks and save it."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    if config.threads:
        torch.set_num_threads(config.threads)
    out = config.out or resolve_model(config.name).directory
    model = pretrain(config.steps, config.batch_size, config.lr, config.seed, name=config.name)
    model.save_pretrained(out)
    log.info("saved %s", out)


if __name__ == "__main__":
    main()
