"""On-policy distillation in the learner: each token's advantage is (1 − w)·A + w·(log π_T − log π_S) by hand on
random values; the step's reverse-KL figures, overall and per domain; a distilled step's loss and gradients are the
same tree-packed as sample by sample, with every loss; a teacher of another tokenizer is refused in one line before
anything starts, and --teacher goes with --teacher-actor."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from click.testing import CliRunner

from forge.learner.cli import learner
from forge.learner.distill import (
    Distillation,
    check_same_tokenizer,
    distill_figures,
    distilled_advantages,
)
from forge.learner.lora import LoraConfig, add_adapters
from forge.learner.losses import LossConfig
from forge.learner.parallel import Distributed
from forge.learner.recompute import learner_logprobs
from forge.learner.rewards import RewardConfig
from forge.learner.samples import Sample
from forge.learner.trainer import Trainer
from forge.learner.trainer_config import TrainerConfig
from forge.pool import Pool, WindowConfig
from forge.v1 import pool_pb2

from helpers.gradients import capture_gradients
from helpers.learner_runs import make_model
from helpers.lora import randomize_adapters
from helpers.random_model import copy_of, random_tiny
from helpers.threads import one_thread  # noqa: F401  (autouse)


def sample(rng: random.Random, domain: str, advantage: float) -> Sample:
    prompt = [rng.randrange(60) for _ in range(rng.randrange(1, 6))]
    completion = [rng.randrange(60) for _ in range(rng.randrange(1, 8))]
    return Sample(tokens=prompt + completion, prompt_len=len(prompt),
                  old_logprobs=[-rng.random() * 4 for _ in completion], versions=[0] * len(completion),
                  advantage=advantage, temperature=1.0, top_k=0, top_p=1.0, domain=domain, position=0,
                  session_id="s", call_index=0)


@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_each_token_s_advantage_mixes_the_reward_s_and_the_teacher_s_by_hand(weight):
    rng = random.Random(int(weight * 100))
    samples = [sample(rng, ("qa", "math")[i % 2], rng.uniform(-1, 1)) for i in range(7)]
    teacher = [[-rng.random() * 4 for _ in s.old_logprobs] for s in samples]
    distilled_advantages(samples, teacher, weight)
    for s, scores in zip(samples, teacher, strict=True):
        expected = [(1 - weight) * s.advantage + weight * (t - b) for t, b in zip(scores, s.old_logprobs, strict=True)]
        assert s.completion_advantages() == pytest.approx(expected, abs=1e-12)
    figures = distill_figures(samples, teacher)
    for domain in ("", "qa", "math"):
        kept = [(s, t) for s, t in zip(samples, teacher, strict=True) if domain in ("", s.domain)]
        gaps = [b - x for s, t in kept for b, x in zip(s.old_logprobs, t, strict=True)]
        assert figures["distill_kl" + (f"/{domain}" if domain else "")] == pytest.approx(sum(gaps) / len(gaps))
    with pytest.raises(RuntimeError, match="scored 1 tokens"):
        distilled_advantages(samples[:1], [[0.0]] if samples[0].num_completion != 1 else [[0.0, 0.0]], weight)


class InProcessTeacher:
    """The scorer's part played by a model in this process: each sample's completion log-probs as the learner
    computes them (the actors' scoring is checked against the same numbers in the integration suite)."""

    def __init__(self, model) -> None:
        self.model = model
        self.asked = 0

    def score(self, samples: list[Sample]) -> list[list[float]]:
        self.asked += len(samples)
        calls = [pool_pb2.CallRecord(prompt_ids=s.tokens[:s.prompt_len], completion_ids=s.tokens[s.prompt_len:],
                                     logprobs=s.old_logprobs) for s in samples]
        return [values.tolist() for values in learner_logprobs(self.model, calls)]

    def close(self) -> None:
        pass


def write_pool(path, groups: int, seed: int) -> None:
    rng = random.Random(seed)
    with Pool(path) as pool:
        for group in range(groups):
            prompt = [rng.randrange(1, 64) for _ in range(6)]
            for rollout in range(3):
                record = pool.open_session(task_id=f"t{group}", domain=("qa", "math")[group % 2],
                                           group_id=f"g{group}", group_size=3)
                completion = [rng.randrange(1, 64) for _ in range(rng.randrange(2, 6))]
                call = pool_pb2.CallRecord(session_id=record.session_id, index=0, prompt_ids=prompt,
                                           completion_ids=completion, weight_versions=[0] * len(completion),
                                           logprobs=[-rng.random() * 3 for _ in completion], actor="test",
                                           finish_reason=1)
                pool.append_call(call)
                pool.close_session(session_id=record.session_id, outcome_rewards={"r": float(rollout == 0)})


@pytest.mark.parametrize("kind,lora", [("cispo", False), ("gspo", False), ("dapo", False), ("cispo", True),
                                       ("dr_grpo", True)])
def test_a_distilled_step_is_the_same_tree_packed_and_sample_by_sample(tmp_path, kind, lora):
    """With every loss, and training LoRA adapters (their B drawn at random) as well as the whole model."""
    model, teacher = make_model(6), make_model(7)
    write_pool(tmp_path / "pool", 4, seed=2)
    adapters = LoraConfig(rank=4, alpha=8.0) if lora else None
    runs = {}
    for tree in (True, False):
        shutil.copytree(tmp_path / "pool", tmp_path / f"pool-{tree}")
        trained = copy_of(model)
        if adapters is not None:
            randomize_adapters(add_adapters(trained, adapters), seed=1)
        scorer = InProcessTeacher(teacher)
        trainer = Trainer(trained, Distributed(), TrainerConfig(lr=1e-2, tree=tree, micro_batch_tokens=24),
                          LossConfig(kind=kind), RewardConfig(), WindowConfig(mode="fifo", batch_groups=4),
                          Pool(tmp_path / f"pool-{tree}"), distillation=Distillation(0.7, scorer), lora=adapters)
        grads = capture_gradients(trainer, trained)
        record = trainer.step()
        assert scorer.asked == 12
        runs[tree] = record, {k: v.clone() for k, v in grads.items()}
    (tree_record, tree_grads), (linear_record, linear_grads) = runs[True], runs[False]
    assert tree_record["packed_tokens"] < linear_record["packed_tokens"]
    assert linear_record["distill_kl"] != 0.0 and "distill_kl/qa" in linear_record
    for key in ("loss", "policy_loss", "distill_kl", "distill_kl/qa", "distill_kl/math"):
        assert tree_record[key] == pytest.approx(linear_record[key], rel=1e-5, abs=1e-6), key
    for key, grad in linear_grads.items():
        torch.testing.assert_close(tree_grads[key], grad, atol=1e-5, rtol=1e-4, msg=key)


def other_tokenizer(tmp_path):
    """The tiny model with two of its tokenizer's tokens swapped: the same vocabulary size, other ids."""
    path = random_tiny(tmp_path / "other", seed=1)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[40:42]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return path


def test_a_teacher_of_another_tokenizer_is_refused_in_one_line_before_anything(tmp_path):
    check_same_tokenizer("tiny", str(random_tiny(tmp_path / "same", seed=2)))
    other = other_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="does not share the student's tokenizer") as refused:
        check_same_tokenizer("tiny", str(other))
    assert "\n" not in str(refused.value)
    args = ["--pool", str(tmp_path / "pool"), "--create-pool", "--run-dir", str(tmp_path / "run"), "--teacher",
            str(other), "--teacher-actor", "127.0.0.1:9"]
    result = CliRunner().invoke(learner, args)
    assert result.exit_code == 2, result.output
    assert "--teacher" in result.output and "does not share the student's tokenizer" in result.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "pool").exists()
    result = CliRunner().invoke(learner, args[:-2])
    assert result.exit_code == 2 and "--teacher and --teacher-actor go together" in result.output


def test_forge_up_plans_the_teacher_s_actors_before_the_learner_and_refuses_another_tokenizer(tmp_path):
    from forge.app.up.config import UpConfig
    from forge.app.up.plan import Plan
    from forge.settings import SettingsError

    teacher = random_tiny(tmp_path / "teacher", seed=2)
    config = UpConfig(run_dir=tmp_path / "run", teacher_actors=2).with_services(learner={"teacher": str(teacher)})
    plan = Plan(config)
    found = {instance.name: instance for instance in plan.check()}
    assert plan.teacher_names() == ["teacher-0", "teacher-1"]
    for name in plan.teacher_names():
        settings = found[name].settings
        assert settings.model == str(teacher) and settings.backend == "auto" and settings.weights_fetch is None
    learner_settings = found["learner"].settings
    assert learner_settings.teacher == str(teacher) and len(learner_settings.teacher_actors) == 2
    assert found["actor-0"].settings.model == "tiny"
    assert "teacher-0" not in {i.name for i in Plan(UpConfig(run_dir=tmp_path / "plain")).check()}
    refused = UpConfig(run_dir=tmp_path / "run").with_services(learner={"teacher": str(other_tokenizer(tmp_path))})
    with pytest.raises(SettingsError, match=r"teacher: .*does not share the student's tokenizer"):
        Plan(refused)
