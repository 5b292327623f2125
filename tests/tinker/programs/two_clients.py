"""Two teams on one Forge Tinker server at once, each with its own API key, both LoRA on the same base model (run in
the SDK's environment): each trains its own completion and its loss falls; neither can read the other's saved state
or sample from its sampler weights. Prints one JSON object of what it saw.

Usage: TINKER_BASE_URL=... python two_clients.py BASE_MODEL KEY_A KEY_B"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import tinker
from tinker import types

PROMPT = [5, 17, 42, 99]
COMPLETIONS = {"a": [61, 62, 63, 64], "b": [300, 301, 302, 303]}


def train(base_model: str, key: str, completion: list[int]) -> dict:
    service = tinker.ServiceClient(api_key=key)
    training = service.create_lora_training_client(base_model=base_model, rank=4, seed=1)
    tokens = PROMPT + completion
    data = [types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:],
                                        "weights": [0.0] * (len(PROMPT) - 1) + [1.0] * len(completion)})]
    losses = []
    for _ in range(5):
        result = training.forward_backward(data, "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        losses.append(result.metrics["loss:sum"])
    state = training.save_state("mine").result().path
    sampler = training.save_weights_for_sampler("mine-sampler").result().path
    return {"losses": losses, "state": state, "sampler": sampler, "model_id": training.model_id}


def refused(call) -> str:
    """The error category (or the exception's name) a call ends with; "" when it succeeded."""
    try:
        call()
    except tinker.RequestFailedError as exc:
        return f"category:{exc.category}"
    except Exception as exc:       # any refusal counts: its kind is reported
        return type(exc).__name__
    return ""


def main(base_model: str, key_a: str, key_b: str) -> None:
    with ThreadPoolExecutor(2) as pool:
        ran = dict(zip("ab", pool.map(lambda args: train(base_model, *args),
                                      [(key_a, COMPLETIONS["a"]), (key_b, COMPLETIONS["b"])]), strict=True))
    service_b = tinker.ServiceClient(api_key=key_b)
    seen = {
        "runs": ran,
        "b_loads_a": refused(lambda: service_b.create_training_client_from_state(ran["a"]["state"]).result()),
        "b_samples_a": refused(lambda: service_b.create_sampling_client(model_path=ran["a"]["sampler"]).sample(
            types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=2)).result()),
        "b_lists_a": refused(lambda: service_b.create_rest_client().list_checkpoints(ran["a"]["model_id"]).result()),
        "b_loads_own": refused(lambda: service_b.create_training_client_from_state(ran["b"]["state"]).result()),
    }
    print(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:4])
