"""A team's own loop through the official tinker SDK alone, against forge-tinker training with the learner's code and
sampling on a real forge-actor: the loss falls over steps, forward's log-probs are forward_backward's, the sampler's
own log-probs give importance ratios of 1 (learner = actor), the trained completion's log-prob rose between two saved
samplers, a resume with the optimizer's state takes the same next step, and two keys train on one base at once, each
unable to read, sample or list what the other saved."""

from __future__ import annotations

import pytest

from helpers.tinker_stack import KEYS, tinker_stack

pytestmark = pytest.mark.tinker


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with tinker_stack(tmp_path_factory.mktemp("tinker-sdk")) as running:
        yield running


def test_a_loop_written_with_the_sdk_trains_samples_and_resumes(stack):
    seen = stack.run("sdk_loop.py", stack.base_model)
    assert seen["info"]["model_data"]["tokenizer_id"] == stack.base_model and seen["info"]["is_lora"]
    losses = seen["losses"]
    assert losses[-1] < 0.5 * losses[0]
    for forward, backward in zip(seen["forward_logprobs"], seen["forward_backward_logprobs"], strict=True):
        assert forward == pytest.approx(backward, abs=1e-6)
    ratios = seen["importance_ratios"]
    assert len(ratios) >= 3 and max(abs(r - 1.0) for r in ratios) < 1e-5
    assert seen["completion_logprob_after"] > seen["completion_logprob_before"] + 1.0
    assert seen["saved_path"].startswith("tinker://") and "/weights/resume-here" in seen["saved_path"]
    (next_loss, next_logprobs), (resumed_loss, resumed_logprobs) = seen["next_step"], seen["resumed_step"]
    assert resumed_loss == pytest.approx(next_loss, rel=1e-6)
    for a, b in zip(next_logprobs, resumed_logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    assert stack.server.alive


def test_two_keys_train_on_one_base_at_once_and_keep_to_their_own(stack):
    seen = stack.run("two_clients.py", stack.base_model, *KEYS)
    for run in seen["runs"].values():
        assert run["losses"][-1] < run["losses"][0]
    assert seen["runs"]["a"]["model_id"] != seen["runs"]["b"]["model_id"]
    for refused in ("b_loads_a", "b_samples_a", "b_lists_a"):
        assert seen[refused], f"{refused}: another key's checkpoint was served"
    assert seen["b_loads_own"] == ""
    assert stack.server.alive
