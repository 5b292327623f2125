"""A loop that outlives its server (run in the SDK's environment, twice). ``train``: a few cross-entropy steps, the
state saved with the optimizer's and sampler weights saved, then one more step, whose loss and log-probs it records
(what the uninterrupted run did next). ``resume`` (after the server was killed and started again on the same run
directory): the checkpoints listed through the RestClient, a training client made from the saved state with its
optimizer taking that same next step, a sampling client on the saved sampler weights sampling, and sampler weights
saved again under their name sampling the new weights, then deleted and refused. Each prints one JSON object of what
it saw; tests/tinker/test_restart.py judges them.

Usage: TINKER_BASE_URL=... TINKER_API_KEY=tml-... python restart.py train BASE_MODEL
       ... python restart.py resume BASE_MODEL STATE_PATH SAMPLER_PATH"""

from __future__ import annotations

import json
import sys

import tinker
from tinker import types

PROMPT = [5, 17, 42, 99, 7, 250, 3]
COMPLETION = [61, 62, 63, 64, 65, 66]
LEARNING_RATE = 1e-2


def batch() -> list[types.Datum]:
    tokens = PROMPT + COMPLETION
    weights = [0.0] * (len(PROMPT) - 1) + [1.0] * len(COMPLETION)
    return [types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})]


def step(training: tinker.TrainingClient) -> dict:
    result = training.forward_backward(batch(), "cross_entropy").result()
    optim = training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()
    return {"loss": result.metrics["loss:sum"], "logprobs": result.loss_fn_outputs[0]["logprobs"].tolist(),
            "step": optim.metrics.get("step:max")}


def train(base_model: str) -> dict:
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=base_model, rank=8, seed=0)
    losses = [step(training)["loss"] for _ in range(3)]
    state_path = training.save_state("before-kill").result().path
    sampler_path = training.save_weights_for_sampler("before-kill-sampler").result().path
    after_save = step(training)            # what the uninterrupted run did next
    forward = training.forward(batch(), "cross_entropy").result()
    return {"model_id": training.model_id, "losses": losses, "state_path": state_path,
            "sampler_path": sampler_path, "next_step": after_save,
            "after_next_step_logprobs": forward.loss_fn_outputs[0]["logprobs"].tolist()}


def resume(base_model: str, state_path: str, sampler_path: str) -> dict:
    service = tinker.ServiceClient()
    rest = tinker.RestClient()
    model_id = types.ParsedCheckpointTinkerPath.from_tinker_path(state_path).training_run_id
    listed = rest.list_checkpoints(model_id).result().checkpoints
    mine = rest.list_user_checkpoints().result().checkpoints
    runs = rest.list_training_runs().result().training_runs
    resumed = service.create_training_client_from_state_with_optimizer(state_path).result()
    next_step = step(resumed)
    forward = resumed.forward(batch(), "cross_entropy").result()
    sampler = service.create_sampling_client(model_path=sampler_path)
    return {"checkpoints": sorted(c.tinker_path for c in listed), "user_checkpoints": sorted(c.tinker_path for c in mine),
            "runs": [r.training_run_id for r in runs], "base_model": base_model, "next_step": next_step,
            "after_next_step_logprobs": forward.loss_fn_outputs[0]["logprobs"].tolist(),
            "samples": samples(sampler), **rewritten_and_deleted(service, rest, resumed)}


def samples(sampler: tinker.SamplingClient) -> list[dict]:
    """Two samples with their log-probs as the actor gave them and as the training side scores the same tokens."""
    sampled = sampler.sample(types.ModelInput.from_ints(PROMPT), num_samples=2,
                             sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)).result()
    scored = [sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + list(s.tokens))).result()
              for s in sampled.sequences]
    return [{"tokens": list(s.tokens), "logprobs": list(s.logprobs), "scored": list(score[len(PROMPT):])}
            for s, score in zip(sampled.sequences, scored, strict=True)]


def rewritten_and_deleted(service: tinker.ServiceClient, rest: tinker.RestClient,
                          training: tinker.TrainingClient) -> dict:
    """Sampler weights sampled, saved again under the same name after a step (sampled again: the new weights
    only), then deleted (sampling them is refused)."""
    path = training.save_weights_for_sampler("rewritten").result().path
    before = samples(service.create_sampling_client(model_path=path))
    step(training)
    assert training.save_weights_for_sampler("rewritten").result().path == path
    after = samples(service.create_sampling_client(model_path=path))
    rest.delete_checkpoint_from_tinker_path(path).result()
    try:
        service.create_sampling_client(model_path=path).sample(
            types.ModelInput.from_ints(PROMPT), num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=2)).result()
        refused = ""
    except Exception as exc:
        refused = type(exc).__name__ + ": " + str(exc)[:200]
    return {"rewritten_before": before, "rewritten_after": after, "deleted_refused": refused}


if __name__ == "__main__":
    phase, base = sys.argv[1], sys.argv[2]
    print(json.dumps(train(base) if phase == "train" else resume(base, *sys.argv[3:5])))
