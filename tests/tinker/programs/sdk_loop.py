"""A team's own training loop, written with the official tinker SDK alone (run in the SDK's environment): token ids
on a base model, LoRA, cross-entropy steps, forward against forward_backward, importance sampling on the sampler's
own log-probabilities, sampling and compute_logprobs before and after training, and a resume with the optimizer's
state. It prints one JSON object of what it saw; tests/tinker/test_sdk.py judges it.

Usage: TINKER_BASE_URL=... TINKER_API_KEY=tml-... python sdk_loop.py BASE_MODEL"""

from __future__ import annotations

import json
import math
import sys

import tinker
from tinker import types

PROMPT = [5, 17, 42, 99, 7, 250, 3]
COMPLETION = [61, 62, 63, 64, 65, 66]
LEARNING_RATE = 1e-2


def datum(prompt: list[int], completion: list[int], **extra: list[float]) -> types.Datum:
    """Next-token prediction over prompt + completion, the completion's tokens weighted 1 (the cookbook's layout)."""
    tokens = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    inputs = {"target_tokens": tokens[1:], "weights": weights, **extra}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def completion_logprob(client: tinker.SamplingClient) -> float:
    logprobs = client.compute_logprobs(types.ModelInput.from_ints(PROMPT + COMPLETION)).result()
    return sum(logprobs[len(PROMPT):])


def step(training: tinker.TrainingClient, data: list[types.Datum]) -> tuple[float, list[list[float]]]:
    result = training.forward_backward(data, "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()
    return result.metrics["loss:sum"], [out["logprobs"].tolist() for out in result.loss_fn_outputs]


def importance_ratios(training: tinker.TrainingClient, sampler: tinker.SamplingClient) -> list[float]:
    """Sample from the saved weights, then score the samples under the same weights with importance_sampling: the
    ratio of learner to sampler probability, per sampled token."""
    sampled = sampler.sample(types.ModelInput.from_ints(PROMPT), num_samples=3,
                             sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)).result()
    data, recorded = [], []
    for sequence in sampled.sequences:
        pad = [0.0] * (len(PROMPT) - 1)
        data.append(datum(PROMPT, list(sequence.tokens), logprobs=pad + list(sequence.logprobs),
                          advantages=pad + [1.0] * len(sequence.tokens)))
        recorded.append(list(sequence.logprobs))
    result = training.forward(data, "importance_sampling").result()
    ratios = []
    for out, old in zip(result.loss_fn_outputs, recorded, strict=True):
        new = out["logprobs"].tolist()[len(PROMPT) - 1:]
        ratios += [math.exp(n - o) for n, o in zip(new, old, strict=True)]
    return ratios


def main(base_model: str) -> None:
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=base_model, rank=8, seed=0)
    data = [datum(PROMPT, COMPLETION), datum(PROMPT[:4], COMPLETION[:3])]
    seen: dict = {"info": training.get_info().model_dump(mode="json")}

    before = training.save_weights_and_get_sampling_client(name="before")
    seen["completion_logprob_before"] = completion_logprob(before)
    forward = training.forward(data, "cross_entropy").result()
    seen["forward_logprobs"] = [out["logprobs"].tolist() for out in forward.loss_fn_outputs]
    losses, first_logprobs = [], None
    for _ in range(6):
        loss, logprobs = step(training, data)
        first_logprobs = first_logprobs or logprobs
        losses.append(loss)
    seen["losses"] = losses
    seen["forward_backward_logprobs"] = first_logprobs

    after = training.save_weights_and_get_sampling_client(name="after")
    seen["completion_logprob_after"] = completion_logprob(after)
    seen["importance_ratios"] = importance_ratios(training, after)

    saved = training.save_state("resume-here").result().path
    seen["saved_path"] = saved
    seen["next_step"] = step(training, data)
    resumed = service.create_training_client_from_state_with_optimizer(saved)
    seen["resumed_step"] = step(resumed, data)
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
