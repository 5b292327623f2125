"""Every endpoint the official tinker SDK calls on a training-only server, through the SDK alone (run in the SDK's
environment): capabilities, a LoRA model and its info, a batch the SDK splits into several forward_backward requests
(their losses add up), forward against forward_backward, optim_step, save_state and a sampler save with their
tinker:// paths, the RestClient's training runs, checkpoints and weights info, a new model from a saved state with
its optimizer, a checkpoint deleted, a refused loss (a user error), and the session closed. Prints one JSON object
of what it saw; tests/tinker/test_protocol_sdk.py judges it.

Usage: TINKER_BASE_URL=... TINKER_API_KEY=tml-... python protocol.py BASE_MODEL"""

from __future__ import annotations

import json
import sys

import tinker
from tinker import types

TOKENS = [5, 17, 42, 99, 7, 250, 3]
SPLIT_BATCH = 1100          # over the server's 1024 data per request: the SDK sends two requests


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


def main(base_model: str) -> None:
    seen: dict = {}
    rest = tinker.RestClient()
    seen["models"] = [m.model_name for m in rest.get_server_capabilities().result().supported_models]
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=base_model, rank=4, seed=0).result()
    seen["model_id"] = training.model_id
    seen["info"] = training.get_info().model_dump(mode="json")
    one = training.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"]
    many = training.forward([datum(TOKENS)] * SPLIT_BATCH, "cross_entropy").result()
    seen["split_loss_ratio"] = many.metrics["loss:sum"] / one
    seen["split_outputs"] = len(many.loss_fn_outputs)
    forward = training.forward([datum(TOKENS)], "cross_entropy").result()
    backward = training.forward_backward([datum(TOKENS)], "cross_entropy").result()
    seen["forward_logprobs"] = forward.loss_fn_outputs[0]["logprobs"].tolist()
    seen["forward_backward_logprobs"] = backward.loss_fn_outputs[0]["logprobs"].tolist()
    seen["optim_metrics"] = training.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics
    seen["state_path"] = training.save_state("step-1").result().path
    seen["sampler_path"] = training.save_weights_for_sampler("sampler-1").result().path
    runs = rest.list_training_runs().result()
    seen["runs"] = [r.training_run_id for r in runs.training_runs]
    seen["checkpoints"] = sorted(c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints)
    seen["weights_info"] = rest.get_weights_info_by_tinker_path(seen["state_path"]).result().model_dump(mode="json")
    seen["run_of_path"] = rest.get_training_run_by_tinker_path(seen["state_path"]).result().training_run_id
    resumed = service.create_training_client_from_state_with_optimizer(seen["state_path"]).result()
    seen["resumed_model_id"] = resumed.model_id
    seen["resumed_loss"] = resumed.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"]
    seen["trained_loss"] = training.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"]
    rest.delete_checkpoint_from_tinker_path(seen["sampler_path"]).result()
    seen["after_delete"] = sorted(c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints)
    try:
        training.forward_backward([datum(TOKENS)], "no_such_loss").result()
        seen["refused"] = None
    except Exception as exc:       # the SDK raises the server's 400 as BadRequestError
        seen["refused"] = type(exc).__name__
    service.close("success").result()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
