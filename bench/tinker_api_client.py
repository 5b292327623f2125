"""The SDK side of ``bench/tinker_api.py``, run in the official SDK's environment (``.venv-tinker``) against a
forge-tinker process: it reads what to do from a JSON file, prepares its clients and data, warms up once, prints
``ready``, and then times one repetition each time a line ``step`` arrives on stdin, answering with one JSON line
(``seconds`` and what was produced). The bench drives it step by step so that its repetitions interleave with the
baseline's.

- ``train``: a LoRA training client; a step is ``forward_backward`` (cross-entropy on the given batch) and
  ``optim_step``, both submitted at once (as tinker-cookbook does) and waited for.
- ``sample``: a sampling client on the base model; a step submits one ``sample`` per prompt (``num_samples`` each,
  ``max_tokens`` with ``stop=[]``, so every sequence is full length) and waits for all of them.

Usage (with TINKER_BASE_URL and TINKER_API_KEY set): python bench/tinker_api_client.py SPEC.json
"""

from __future__ import annotations

import json
import sys
import time

import tinker
from tinker import types


def training_step(training: tinker.TrainingClient, data: list[types.Datum], learning_rate: float) -> dict:
    started = time.perf_counter()
    forward = training.forward_backward(data, "cross_entropy")
    step = training.optim_step(types.AdamParams(learning_rate=learning_rate))
    loss = forward.result().metrics["loss:sum"]
    step.result()
    return {"seconds": time.perf_counter() - started, "loss": loss}


def sampling_step(sampler: tinker.SamplingClient, prompts: list[types.ModelInput], num_samples: int,
                  params: types.SamplingParams) -> dict:
    started = time.perf_counter()
    futures = [sampler.sample(prompt, num_samples=num_samples, sampling_params=params) for prompt in prompts]
    responses = [future.result() for future in futures]
    seconds = time.perf_counter() - started
    sequences = [s for r in responses for s in r.sequences]
    return {"seconds": seconds, "samples": len(sequences), "tokens": sum(len(s.tokens) for s in sequences)}


def prepare(spec: dict):
    """The function that runs one repetition of ``spec``."""
    service = tinker.ServiceClient()
    if spec["mode"] == "train":
        training = service.create_lora_training_client(base_model=spec["base_model"], rank=spec["rank"], seed=0)
        data = [types.Datum(model_input=types.ModelInput.from_ints(d["tokens"]),
                            loss_fn_inputs={"target_tokens": d["targets"], "weights": d["weights"]})
                for d in spec["data"]]
        return lambda: training_step(training, data, spec["learning_rate"])
    sampler = service.create_sampling_client(base_model=spec["base_model"])
    prompts = [types.ModelInput.from_ints(p) for p in spec["prompts"]]
    params = types.SamplingParams(max_tokens=spec["max_tokens"], temperature=1.0, seed=spec.get("seed", 0), stop=[])
    return lambda: sampling_step(sampler, prompts, spec["num_samples"], params)


def main(path: str) -> None:
    with open(path) as f:
        spec = json.load(f)
    step = prepare(spec)
    step()                                     # warm-up: first passes, connections, the actor's caches
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(json.dumps(step()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
