"""The learner as processes: FSDP2 1-process vs 2-process equality (torchrun), exactly-once training across a
kill -9 and a restart, and SIGTERM stopping after a step with a checkpoint. (In-process: unit/test_learner.py.)"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import torch

from forge.checkpoints import load_model
from forge.learner.checkpoint import Checkpointer
from forge.learner.lora import LoraConfig, adapter_version
from forge.pool import Pool

from conftest import script
from helpers.families import FAMILIES, SMALL, fill_on_policy, write_family
from helpers.learner_runs import (
    CONFIG,
    MOE_CONFIG,
    Step,
    assert_same_update,
    fill_from,
    lineage,
    make_model,
    steps,
    write_model_and_pool,
)
from helpers.waiting import wait_for

CONFIGS = {"dense": CONFIG, "experts": MOE_CONFIG}
AFTER_A_STEP, FOR_A_FAMILY, WITH_LORA = ("test_fsdp2_two_processes_equal_one_after_a_step",
                                         "test_fsdp2_two_processes_equal_one_for_a_family_trained_through_transformers",
                                         "test_fsdp2_two_processes_equal_one_with_lora")
FOR_EACH_LOSS = "test_fsdp2_two_processes_equal_one_with_lora_for_each_loss"
# Each loss besides CISPO, with LoRA adapters (rank 4), two of them with the reference KL (LoRA's: adapters off) and
# a mismatch correction on top.
LOSSES = {"ppo": (("kind", "ppo"),), "grpo": (("kind", "grpo"), ("kl_coef", 0.2), ("correction", "icepop")),
          "gspo": (("kind", "gspo"), ("kl_coef", 0.3), ("kl_estimator", "k2"), ("correction", "tis")),
          "dapo": (("kind", "dapo"),), "dr_grpo": (("kind", "dr_grpo"), ("dr_grpo_max_tokens", 16))}


@pytest.fixture(scope="module")
def fsdp2_steps(request, tmp_path_factory) -> dict[tuple[str, str], tuple[dict, dict, dict]]:
    """For each FSDP2 case the session runs (test name, case id): the parameters before, and what one step on 1 and
    on 2 ranks saved. Every case's 1-rank steps run in one torchrun job and its 2-rank steps in another (each step
    from a fresh seed, model and trainer), so torch and the job start twice, not twice per case."""
    selected = {(item.originalname, item.callspec.id) for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    root = tmp_path_factory.mktemp("fsdp2")
    prepared: dict[tuple[str, str], tuple[Path, Path, int, dict]] = {}
    for test, seed, lora_rank in ((AFTER_A_STEP, 5, 0), (WITH_LORA, 6, 4)):
        for label, config in CONFIGS.items():
            if (test, label) in selected:
                directory = root / f"{label}-lora{lora_rank}"
                model = make_model(seed, config)
                model.save_pretrained(directory / "model")
                with Pool(directory / "pool") as pool:
                    fill_from(pool, model, groups=4, group_size=3, calls=2, max_tokens=9)
                prepared[test, label] = (directory, directory / "model", lora_rank, model.state_dict())
    for family in sorted(FAMILIES):
        if (FOR_A_FAMILY, family) in selected:
            directory = root / family
            model_dir, reference = write_family(directory / "model", family, seed=5)
            with Pool(directory / "pool") as pool:
                fill_on_policy(pool, load_model(model_dir)[0], groups=4, vocab=SMALL["vocab_size"], group_size=3,
                               system_len=12)
            prepared[FOR_A_FAMILY, family] = (directory, model_dir, 0, reference.state_dict())
    losses = {case: () for case in prepared}
    for name, loss in LOSSES.items():
        if (FOR_EACH_LOSS, name) in selected:
            directory = root / f"loss-{name}"
            model = make_model(7, CONFIG)
            model.save_pretrained(directory / "model")
            with Pool(directory / "pool") as pool:
                fill_from(pool, model, groups=4, group_size=3, calls=2, max_tokens=9)
            prepared[FOR_EACH_LOSS, name] = (directory, directory / "model", 4, model.state_dict())
            losses[FOR_EACH_LOSS, name] = loss
    results = iter(steps([Step(directory, model_dir, nproc, lora_rank, loss=losses[case])
                          for case, (directory, model_dir, lora_rank, _) in prepared.items() for nproc in (1, 2)]))
    return {case: (before, next(results), next(results)) for case, (*_, before) in prepared.items()}


@pytest.mark.timeout(1800)              # the first FSDP2 test starts every case's two jobs
@pytest.mark.parametrize("config", list(CONFIGS))
def test_fsdp2_two_processes_equal_one_after_a_step(fsdp2_steps, config):
    """With experts, the experts are sharded with the rest and every token is routed as its record says."""
    before, one, two = fsdp2_steps[AFTER_A_STEP, config]
    assert one["tokens"] == two["tokens"] == 4 * 3 * 2 * 9
    assert one["stem_tokens"] > 0 and two["stem_tokens"] > 0      # the trees of a step share a stem on each rank
    assert_same_step(one, two, before)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fsdp2_two_processes_equal_one_for_a_family_trained_through_transformers(fsdp2_steps, family):
    """Each family (transformers' code, windows and soft caps included, sharded per decoder layer, trained in packed
    trees that share a stem) steps alike on 1 and 2."""
    before, one, two = fsdp2_steps[FOR_A_FAMILY, family]
    assert one["tokens"] == two["tokens"] > 0 and one["stem_tokens"] > 0 and two["stem_tokens"] > 0
    assert_same_step(one, two, before)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_fsdp2_two_processes_equal_one_with_lora(fsdp2_steps, config):
    """Adapters sharded with their layers beside frozen weights; only they and the MTP draft move."""
    assert_same_lora_step(*fsdp2_steps[WITH_LORA, config])


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("loss", list(LOSSES))
def test_fsdp2_two_processes_equal_one_with_lora_for_each_loss(fsdp2_steps, loss):
    """Every loss (and the reference KL and a correction on two of them) trains LoRA adapters alike on 1 and 2."""
    assert_same_lora_step(*fsdp2_steps[FOR_EACH_LOSS, loss])


def assert_same_lora_step(base: dict, one: dict, two: dict) -> None:
    assert one["loss"] == pytest.approx(two["loss"], abs=1e-5) and one["tokens"] == two["tokens"] > 0
    trained = {name for name in one["grads"] if ".lora_" in name or name.startswith("mtp.")}
    assert one["grads"].keys() == two["grads"].keys() == trained and len(trained) > 10
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    for name, tensor in one["state"].items():
        assert_same_update(one, two, name)
        if ".base_layer." in name or (name in base and not name.startswith("mtp.")):
            assert torch.equal(tensor, base[name.replace(".base_layer", "")]), f"{name} is frozen"
    lora = LoraConfig(rank=4, alpha=8.0)
    for result in (one, two):           # a version gathers the adapters and the draft alone, and sends them whole
        sent = adapter_version(result["state"], lora)
        assert result["published"].keys() == sent.keys()
        assert all(torch.equal(result["published"][name], tensor) for name, tensor in sent.items())


def assert_same_step(one: dict, two: dict, before: dict) -> None:
    assert one["loss"] == pytest.approx(two["loss"], abs=1e-5)
    assert one["grads"].keys() == two["grads"].keys() and len(one["grads"]) > 10
    for name, grad in one["grads"].items():       # gradients, which Adam's scale-free first update would hide
        torch.testing.assert_close(two["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    changed = 0
    for name, tensor in one["state"].items():
        assert_same_update(one, two, name)
        changed += int(not torch.equal(tensor, before[name]))
    assert changed > len(before) // 2


def run_learner(pool_dir: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([script("forge-learner"), "--pool", str(pool_dir), "--run-dir", str(run_dir),
                             "--model", str(run_dir.parent / "model"), "--no-publish", "--batch-groups", "1",
                             "--window", "3", "--lr", "1e-3", "--max-wait", "0.5", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kill_minus_nine_then_restart_trains_every_entry_exactly_once(tmp_path):
    write_model_and_pool(tmp_path, seed=1, groups=12)
    run_dir = tmp_path / "run"
    metrics = run_dir / "metrics.jsonl"
    first = run_learner(tmp_path / "pool", run_dir, "--checkpoint-every", "3", "--max-steps", "12")
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5, "the learner's fifth step",
             watched=[first], interval_s=0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = run_learner(tmp_path / "pool", run_dir, "--checkpoint-every", "3", "--max-steps", "12")
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    steps = lineage(metrics)
    assert sorted(steps) == list(range(1, 13))
    trained = [p for step in sorted(steps) for p in steps[step]]
    assert sorted(trained) == list(range(12)), trained
    assert "resumed from" in output


def test_sigterm_stops_after_a_step_with_a_checkpoint(tmp_path):
    write_model_and_pool(tmp_path, seed=2, groups=3)
    run_dir = tmp_path / "run"
    proc = run_learner(tmp_path / "pool", run_dir, "--checkpoint-every", "100")
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().strip(), "the learner's first step", watched=[proc],
             interval_s=0.02)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    latest = Checkpointer(run_dir / "checkpoints").latest()
    assert latest is not None and latest.state["step"] >= 1
