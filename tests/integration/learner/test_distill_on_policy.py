"""On-policy distillation falls toward the teacher: the student (the built-in tiny model) samples completions of
the built-in training prompts at its current weights each step, the learner asks a real ``forge-actor`` serving
the teacher (the tiny model with its weights moved away, the same tokenizer) for their log-probs and trains on the
distilled advantages; the student's reverse KL to the teacher on the held-out prompts, summed exactly over the
vocabulary along the student's own samples, falls over the steps."""

from __future__ import annotations

import random

import pytest
import torch

from forge.checkpoints import TINY_DIR, load_tokenizer
from forge.learner.distill import Distillation, TeacherScorer
from forge.learner.losses import LossConfig
from forge.learner.parallel import Distributed
from forge.learner.rewards import RewardConfig
from forge.learner.trainer import Trainer
from forge.learner.trainer_config import TrainerConfig
from forge.model import CausalLM
from forge.pool import Pool, WindowConfig
from forge.rollout.tasks.builtin_source import held_out, train
from forge.v1 import pool_pb2

from helpers.gateway_procs import start_actor
from helpers.random_model import perturbed_tiny
from helpers.threads import one_thread  # noqa: F401  (autouse)

pytestmark = pytest.mark.timeout(1200)

TOKENS = 24             # a completion's tokens (the end of sequence is not a stop: every position counts)
GROUP = 4


def prompts_of(tasks) -> list[list[int]]:
    tokenizer = load_tokenizer("tiny")
    return [tokenizer.apply_chat_template(task["messages"], add_generation_prompt=True) for task in tasks]


@torch.no_grad()
def sample(model: CausalLM, prompt: list[int], count: int, generator: torch.Generator):
    """``count`` completions of ``prompt`` at temperature 1, and each token's log-prob."""
    ids = torch.tensor([prompt] * count)
    logprobs = []
    for _ in range(TOKENS):
        step = torch.log_softmax(model.logits(model(ids))[:, -1].float(), -1)
        token = torch.multinomial(step.exp(), 1, generator=generator)
        logprobs.append(step.gather(-1, token)[:, 0])
        ids = torch.cat([ids, token], 1)
    return ids[:, len(prompt):].tolist(), torch.stack(logprobs, 1).tolist()


@torch.no_grad()
def held_out_kl(student: CausalLM, teacher: CausalLM, prompts: list[list[int]]) -> float:
    """Mean over the held-out prompts' sampled positions of KL(π_student ‖ π_teacher), exact over the vocabulary."""
    generator = torch.Generator().manual_seed(0)
    total = count = 0.0
    for prompt in prompts:
        ids = torch.tensor([prompt] * 2)
        for _ in range(TOKENS):
            ours = torch.log_softmax(student.logits(student(ids))[:, -1].float(), -1)
            theirs = torch.log_softmax(teacher.logits(teacher(ids))[:, -1].float(), -1)
            total += float((ours.exp() * (ours - theirs)).sum())
            count += 2
            ids = torch.cat([ids, torch.multinomial(ours.exp(), 1, generator=generator)], 1)
    return total / count


def test_the_student_s_held_out_reverse_kl_to_the_teacher_falls(tmp_path):
    teacher_dir = perturbed_tiny(tmp_path / "teacher")
    teacher = CausalLM.from_pretrained(teacher_dir).eval()
    student = CausalLM.from_pretrained(TINY_DIR)
    training, testing = prompts_of(train(30)), prompts_of(held_out(4))
    before = held_out_kl(student.eval(), teacher, testing)
    actor = start_actor(tmp_path, "teacher", "--model", str(teacher_dir))
    scorer = TeacherScorer([actor.address], None, requests=8)
    pool = Pool(tmp_path / "pool")
    trainer = Trainer(student, Distributed(), TrainerConfig(lr=3e-4), LossConfig(), RewardConfig(),
                      WindowConfig(mode="fifo", batch_groups=2), pool, distillation=Distillation(1.0, scorer))
    rng, generator = random.Random(0), torch.Generator().manual_seed(1)
    try:
        steps = []
        for step in range(20):
            for group in range(2):
                prompt = rng.choice(training)
                completions, logprobs = sample(student.eval(), prompt, GROUP, generator)
                for completion, behaviour in zip(completions, logprobs, strict=True):
                    record = pool.open_session(task_id="t", domain="qa", group_id=f"g{step}-{group}",
                                               group_size=GROUP)
                    pool.append_call(pool_pb2.CallRecord(
                        session_id=record.session_id, index=0, prompt_ids=prompt, completion_ids=completion,
                        logprobs=behaviour, weight_versions=[trainer.state.version] * TOKENS, actor="student",
                        finish_reason=2))
                    pool.close_session(session_id=record.session_id, outcome_rewards={"r": 0.0})
            steps.append(trainer.step())
    finally:
        scorer.close()
        actor.stop()
        pool.close()
    assert all(record["distill_kl/qa"] == record["distill_kl"] for record in steps)
    after = held_out_kl(student.eval(), teacher, testing)
    assert after < 0.5 * before, (before, after)
