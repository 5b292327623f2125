"""A server killed (SIGKILL) and started again on the same run directory loses nothing a client was told is saved:
the SDK lists the checkpoints it saved before, a training client made from the saved state with its optimizer takes
exactly the step the uninterrupted run took, and the saved sampler weights are sampled on the actor (which kept
running), their log-probs those the training side computes for the same tokens. Sampler weights saved again under
their name are then sampled with the new weights only, and once deleted are refused."""

from __future__ import annotations

import pytest

from helpers.tinker_stack import tinker_stack

pytestmark = pytest.mark.tinker


def test_a_killed_server_resumes_from_what_it_saved(tmp_path):
    with tinker_stack(tmp_path) as stack:
        first = stack.run("restart.py", "train", stack.base_model)
        assert first["losses"][-1] < first["losses"][0]
        stack.restart_server()
        seen = stack.run("restart.py", "resume", stack.base_model, first["state_path"], first["sampler_path"])
        assert stack.server.alive

    saved = {first["state_path"], first["sampler_path"]}
    assert saved <= set(seen["checkpoints"]) and saved <= set(seen["user_checkpoints"])
    assert first["model_id"] in seen["runs"]
    expected, resumed = first["next_step"], seen["next_step"]
    assert resumed["step"] == expected["step"] == 4
    assert resumed["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert resumed["logprobs"] == pytest.approx(expected["logprobs"], abs=1e-6)
    assert seen["after_next_step_logprobs"] == pytest.approx(first["after_next_step_logprobs"], abs=1e-6)
    for sample in seen["samples"] + seen["rewritten_before"] + seen["rewritten_after"]:
        assert len(sample["tokens"]) == 6
        assert sample["logprobs"] == pytest.approx(sample["scored"], abs=1e-4)
    assert "not found" in seen["deleted_refused"].lower(), seen["deleted_refused"]
