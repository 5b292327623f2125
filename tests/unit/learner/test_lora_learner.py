"""The learner with LoRA: a step's adapter gradients are the full step's weight gradients through the adapters
(dL/dB = s·G·Aᵀ, dL/dA = s·Bᵀ·G, G the full step's gradient on the merged weights), in trees and linearly, with
experts frozen and the MTP draft trained in full; checkpoints hold the merged model and the adapter and resume into
the same policy; a resume that changes LoRA is refused."""

from __future__ import annotations

import dataclasses
import shutil

import click
import pytest
import torch

from forge.checkpoints import load_model
from forge.checkpoints.random_qwen3 import write_qwen3
from forge.learner.checkpoint import Checkpointer
from forge.learner.cli import _initial_model, check_lora_resume
from forge.learner.config import LearnerConfig
from forge.learner.lora import ADAPTER, LoraConfig, add_adapters, merged_state_dict
from forge.learner.losses import LossConfig
from forge.learner.parallel import Distributed
from forge.learner.rewards import RewardConfig
from forge.learner.trainer import Trainer, TrainerConfig
from forge.pool import Pool
from forge.pool.window import WindowConfig

from helpers.families import fill_on_policy
from helpers.gradients import capture_gradients
from helpers.learner_runs import CONFIG, MOE_CONFIG, fill_from, make_model
from helpers.lora import randomize_adapters
from helpers.random_model import copy_of

LORA = LoraConfig(rank=4, alpha=8.0)


def one_step(model, pool_dir, tree: bool, lora: LoraConfig | None) -> tuple[dict, dict]:
    with Pool(pool_dir) as pool:
        trainer = Trainer(model, Distributed(), TrainerConfig(lr=1e-3, tree=tree, micro_batch_tokens=96),
                          LossConfig(mtp_weight=0.5, mtp_top_k=8), RewardConfig(),
                          WindowConfig(window=4, batch_groups=4), pool, lora=lora)
        grads = capture_gradients(trainer, model)
        return trainer.step(), grads


@pytest.mark.parametrize("tree", [True, False], ids=["tree", "linear"])
@pytest.mark.parametrize("config", [CONFIG, MOE_CONFIG], ids=["dense", "experts"])
def test_a_lora_step_is_the_full_step_through_the_adapters(tmp_path, tree, config):
    adapted = add_adapters(copy_of(make_model(4, config)), LORA)
    randomize_adapters(adapted, seed=0)
    merged = make_model(0, config)
    merged.load_state_dict(merged_state_dict(adapted.state_dict(), LORA))
    with Pool(tmp_path / "pool") as pool:
        fill_from(pool, merged, groups=4, group_size=4, calls=3, max_tokens=8)
    shutil.copytree(tmp_path / "pool", tmp_path / "pool-full")
    before = {name: p.detach().clone() for name, p in adapted.named_parameters()}
    lora_record, lora_grads = one_step(adapted, tmp_path / "pool", tree, LORA)
    full_record, full_grads = one_step(merged, tmp_path / "pool-full", False, None)

    assert lora_record["loss"] == pytest.approx(full_record["loss"], abs=1e-5)
    adapted_modules = {name.split(".lora_A.")[0] for name in lora_grads if ".lora_A." in name}
    assert len(adapted_modules) == 7 * config.num_hidden_layers - (3 * config.num_hidden_layers if config.num_experts
                                                                    else 0)   # stacked experts stay frozen
    assert set(lora_grads) == {f"{m}.lora_{ab}.{ADAPTER}.weight" for m in adapted_modules for ab in "AB"} | {
        name for name in full_grads if name.startswith("mtp.")}
    for module in adapted_modules:
        full = full_grads[f"{module}.weight"]
        a, b = before[f"{module}.lora_A.{ADAPTER}.weight"], before[f"{module}.lora_B.{ADAPTER}.weight"]
        torch.testing.assert_close(lora_grads[f"{module}.lora_B.{ADAPTER}.weight"], LORA.scaling * full @ a.T,
                                   atol=1e-6, rtol=1e-4, msg=module)
        torch.testing.assert_close(lora_grads[f"{module}.lora_A.{ADAPTER}.weight"], LORA.scaling * b.T @ full,
                                   atol=1e-6, rtol=1e-4, msg=module)
    for name, grad in full_grads.items():
        if name.startswith("mtp."):
            torch.testing.assert_close(lora_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    assert lora_record["trainable_params"] < full_record["trainable_params"] / 2
    assert 0 < lora_record["optimizer_mb"] < full_record["optimizer_mb"] / 2


def test_a_lora_checkpoint_holds_the_merged_model_and_the_adapter_and_resumes(tmp_path):
    base = write_qwen3(tmp_path / "base", size="small", seed=2)
    config = LearnerConfig(model=str(base), pool_path=tmp_path / "pool", lora=LORA)
    policy, _ = _initial_model(config, None, 0)
    pool = Pool(tmp_path / "pool")
    fill_on_policy(pool, policy, groups=4, vocab=1024)
    checkpoints = Checkpointer(tmp_path / "run" / "checkpoints", tokenizer_dir=base)
    trainer = Trainer(policy, Distributed(), TrainerConfig(lr=1e-2, checkpoint_every=1), LossConfig(),
                      RewardConfig(), WindowConfig(window=2, batch_groups=2, max_wait_s=0.5), pool,
                      checkpointer=checkpoints, lora=LORA, base_model=config.model)
    for _ in range(2):
        trainer.step()
    restored = checkpoints.latest()
    assert (restored.adapter_dir / "adapter_model.safetensors").exists()
    merged, _ = load_model(restored.model_dir)
    ids = torch.tensor([[5, 9, 17, 33, 40, 2]])
    with torch.no_grad():
        torch.testing.assert_close(merged.logits(merged(ids)), policy.eval().logits(policy(ids)), atol=1e-5, rtol=0)

    resumed_policy, _ = _initial_model(config, restored, 0)
    for name, value in resumed_policy.state_dict().items():
        torch.testing.assert_close(value, policy.state_dict()[name], atol=0, rtol=0, msg=name)
    resumed = Trainer(resumed_policy, Distributed(), TrainerConfig(lr=1e-2), LossConfig(), RewardConfig(),
                      WindowConfig(window=2, batch_groups=2), pool, checkpointer=checkpoints, lora=LORA,
                      base_model=config.model)
    assert resumed.restore() and resumed.state.step == 2
    saved, loaded = trainer.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys() and len(saved) == sum(p.requires_grad for p in resumed_policy.parameters())
    for index, moments in saved.items():
        torch.testing.assert_close(loaded[index]["exp_avg"], moments["exp_avg"], atol=0, rtol=0)
    pool.close()

    with pytest.raises(click.UsageError, match="written by a LoRA run"):
        check_lora_resume(restored.adapter_dir, LoraConfig(), config.model)
    with pytest.raises(click.UsageError, match="adapter is rank 4"):
        check_lora_resume(restored.adapter_dir, dataclasses.replace(LORA, rank=8), config.model)
    with pytest.raises(click.UsageError, match="adapter is rank 4"):
        check_lora_resume(restored.adapter_dir, LORA, "tiny")
    shutil.rmtree(restored.adapter_dir)
    with pytest.raises(click.UsageError, match="written by full fine-tuning"):
        check_lora_resume(restored.adapter_dir, LORA, config.model)
