"""The learner's teacher client against real ``forge-actor`` processes serving a teacher: the log-probs it gets
for a step's samples equal the teacher model's own forward pass; samples spread over two actors by their first
tokens (a group's on one); a missing key is refused in one line; an actor that is down is passed over."""

from __future__ import annotations

import random

import pytest
import torch

from forge.learner.distill import Distillation, TeacherScorer
from forge.learner.parallel import Distributed
from forge.learner.samples import Sample
from forge.model import CausalLM

from conftest import free_port
from helpers.gateway_procs import start_actor
from helpers.random_model import random_tiny

KEY = "teacher-test-key"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    directory = tmp_path_factory.mktemp("teacher")
    model_dir = random_tiny(directory, seed=5)
    (directory / "actor.key").write_text(KEY + "\n")
    actors = [start_actor(directory, f"teacher-{i}", "--model", str(model_dir), "--api-key-file",
                          str(directory / "actor.key")) for i in range(2)]
    yield CausalLM.from_pretrained(model_dir).eval(), actors
    for actor in actors:
        actor.stop()


def samples_of(seed: int, groups: int = 4, size: int = 3) -> list[Sample]:
    rng = random.Random(seed)
    found = []
    for group in range(groups):
        prompt = [rng.randrange(1, 200) for _ in range(rng.randrange(3, 40))]
        for _ in range(size):
            completion = [rng.randrange(1, 200) for _ in range(rng.randrange(1, 30))]
            found.append(Sample(tokens=prompt + completion, prompt_len=len(prompt),
                                old_logprobs=[-1.0] * len(completion), versions=[0] * len(completion), advantage=0.5,
                                temperature=1.0, top_k=0, top_p=1.0, domain="qa", position=group,
                                session_id=f"s{group}", call_index=0))
    return found


def forward(model: CausalLM, sample: Sample) -> list[float]:
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([sample.tokens])))[0].float()
    start = sample.prompt_len
    chosen = torch.log_softmax(logits[start - 1:-1], -1).gather(-1, torch.tensor(sample.tokens[start:])[:, None])
    return chosen[:, 0].tolist()


def test_the_teacher_s_log_probs_are_its_forward_pass_over_both_actors(teacher):
    model, actors = teacher
    scorer = TeacherScorer([a.address for a in actors], KEY, requests=8)
    try:
        samples = samples_of(1)
        scores = scorer.score(samples)
        for sample, got in zip(samples, scores, strict=True):
            assert got == pytest.approx(forward(model, sample), abs=1e-4)
        picked = [scorer._actor_of(s) for s in samples]
        assert set(picked) == {0, 1}                            # both actors were asked
        assert all(len(set(picked[g * 3:(g + 1) * 3])) == 1 for g in range(4))    # a group's on one actor
        figures = Distillation(1.0, scorer).apply(samples, Distributed())
        assert figures["distill_kl"] == pytest.approx(
            sum(-1.0 - t for s in scores for t in s) / sum(len(s) for s in scores))
        assert samples[0].token_advantages == pytest.approx([t + 1.0 for t in scores[0]])
    finally:
        scorer.close()


def test_a_bad_key_is_refused_and_a_down_actor_is_passed_over(teacher):
    _, actors = teacher
    refused = TeacherScorer([actors[0].address], "not-the-key", requests=2)
    try:
        with pytest.raises(RuntimeError, match="UNAUTHENTICATED"):
            refused.score(samples_of(2, groups=1, size=1))
    finally:
        refused.close()
    down = f"127.0.0.1:{free_port()}"
    scorer = TeacherScorer([down, actors[1].address], KEY, requests=4)
    try:
        assert all(scores for scores in scorer.score(samples_of(3)))
    finally:
        scorer.close()
