"""The sampling side of the Tinker protocol, in-process (the server composed with the real training part and a
stand-in for the actors): a sampling session on saved sampler weights, asample's future with one sequence id per
sample and its protobuf reply (tokens, log-probs, prompt log-probs with None first), the completion queue of
retrieve_futures, the sampler record, and the refusals of what is not served."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from forge.learner.tinker.config import TinkerConfig
from forge.learner.tinker.server import TinkerServer
from forge.learner.tinker.training import LearnerTraining
from forge.learner.tinker.types import SampledSequence, SampleParams, Sampling
from forge.v1 import tinker_wire_pb2 as pb

KEY = "tml-unit"


class ScriptedSampling(Sampling):
    """Stands in for the actors: each sample is the prompt's last token counted up, with fixed log-probs; the
    sampler paths the server told it to forget are in ``forgotten``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, int, SampleParams]] = []
        self.forgotten: list[str] = []

    async def forget(self, sampler_path: str) -> bool:
        self.forgotten.append(sampler_path)
        return True

    async def sample(self, base_model, sampler_path, prompt, num_samples, params):
        self.calls.append((base_model, sampler_path, num_samples, params))
        return [SampledSequence([prompt[-1] + i, prompt[-1] + i + 1], [-0.5, -0.25], "length")
                for i in range(num_samples)]

    async def close(self) -> None:
        pass


def post(base: str, path: str, body: dict) -> tuple[int, object]:
    request = urllib.request.Request(f"{base}/api/v1/{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-API-Key": KEY})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            payload = reply.read()
            proto = "protobuf" in reply.headers.get("Content-Type", "")
            return reply.status, payload if proto else json.loads(payload)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def result(base: str, request_id: str) -> object:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = post(base, "retrieve_future", {"request_id": request_id})[1]
        if not (isinstance(reply, dict) and reply.get("type") == "try_again"):
            return reply
    raise TimeoutError(request_id)


@pytest.fixture
def served(tmp_path):
    sampling = ScriptedSampling()
    config = TinkerConfig(api_keys=(KEY,), port=0, grpc_port=0, run_dir=tmp_path, poll_hold_s=2.0)
    server = TinkerServer(config, LearnerTraining(tmp_path, device="cpu", dtype="float32"), sampling).start()
    yield server.base_url, sampling
    server.stop()


def new_model(base: str) -> str:
    session = post(base, "create_session", {"tags": [], "sdk_version": "unit"})[1]["session_id"]
    created = post(base, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": "tiny",
                                          "lora_config": {"rank": 2}})[1]
    return result(base, created["request_id"])["model_id"]


def test_a_saved_sampler_samples_with_sequence_ids_and_prompt_logprobs(served):
    base, sampling = served
    session = post(base, "create_session", {"tags": [], "sdk_version": "unit"})[1]["session_id"]
    created = post(base, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": "tiny",
                                          "lora_config": {"rank": 2}})[1]
    model_id = result(base, created["request_id"])["model_id"]
    saved = post(base, "save_weights_for_sampler", {"model_id": model_id, "seq_id": 1, "sampling_session_seq_id": 0})
    reply = result(base, saved[1]["request_id"])
    sampler_id, path = reply["sampling_session_id"], reply["path"]
    assert path.startswith(f"tinker://{model_id}/sampler_weights/")
    with urllib.request.urlopen(urllib.request.Request(f"{base}/api/v1/samplers/{sampler_id}",
                                                       headers={"X-API-Key": KEY})) as reply_:
        assert json.loads(reply_.read()) == {"sampler_id": sampler_id, "base_model": "tiny", "model_path": path}

    prompt = {"chunks": [{"type": "encoded_text", "tokens": [5, 17, 42]}]}
    status, accepted = post(base, "asample", {"sampling_session_id": sampler_id, "seq_id": 0, "num_samples": 2,
                                              "prompt": prompt, "prompt_logprobs": True, "topk_prompt_logprobs": 2,
                                              "sampling_params": {"max_tokens": 2, "stop": ["\n"], "seed": 3}})
    assert status == 200 and len(accepted["sample_sequence_ids"]) == 2
    response = pb.SampleResponse.FromString(result(base, accepted["request_id"]))
    assert [np.frombuffer(s.tokens, "<i4").tolist() for s in response.sequences] == [[42, 43], [43, 44]]
    assert np.frombuffer(response.sequences[0].logprobs, "<f4").tolist() == [-0.5, -0.25]
    prompt_logprobs = np.frombuffer(response.prompt_logprobs, "<f4")
    assert len(prompt_logprobs) == 3 and math.isnan(prompt_logprobs[0]) and (prompt_logprobs[1:] < 0).all()
    assert response.topk_prompt_logprobs.k == 2 and response.topk_prompt_logprobs.length == 3
    base_model, sampler_path, count, params = sampling.calls[-1]
    assert (base_model, sampler_path, count) == ("tiny", path, 2) and params.stop_strings == ("\n",)

    status, polled = post(base, "retrieve_futures", {"target": {"sampling_session_id": sampler_id},
                                                      "prev_cursor": 0, "timeout": 0})
    assert polled["completions"][0]["request_id"] == accepted["request_id"] and polled["cursor"] == 1
    for refused in ({"topk_sample_logprobs": 3}, {"prompt_alt_tokens_k": 1}, {"record_stability_info": True},
                    {"num_samples": 0}, {"sampling_params": {"top_p": 2}}):
        body = {"sampling_session_id": sampler_id, "prompt": prompt, "sampling_params": {"max_tokens": 1},
                **refused}
        status, reply = post(base, "asample", body)
        assert status == 400 and reply["category"] == "user", refused


def test_stop_none_keeps_the_end_of_sequence_stop_and_an_empty_list_drops_every_stop(served):
    base, sampling = served
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [5, 17, 42]}]}
    for stop, at_eos in ((None, True), ([], False), (["\n"], True), ([7], True)):
        body = {"base_model": "tiny", "prompt": prompt, "sampling_params": {"max_tokens": 2, "stop": stop}}
        status, accepted = post(base, "asample", body)
        assert status == 200, accepted
        result(base, accepted["request_id"])
        params = sampling.calls[-1][3]
        assert params.stop_at_eos is at_eos, stop
        assert not params.stop_strings if stop in (None, [], [7]) else params.stop_strings == ("\n",)


def test_a_sampler_checkpoint_written_again_or_deleted_is_forgotten_by_the_actors(served):
    base, sampling = served
    model_id = new_model(base)
    path = f"tinker://{model_id}/sampler_weights/kept"
    for seq in (1, 2):                       # saved, then saved again under the same name
        saved = post(base, "save_weights_for_sampler", {"model_id": model_id, "seq_id": seq, "path": "kept"})
        assert result(base, saved[1]["request_id"])["path"] == path
        assert sampling.forgotten[-1] == path
    state = post(base, "save_weights", {"model_id": model_id, "seq_id": 3, "path": "state"})
    state_path = result(base, state[1]["request_id"])["path"]
    assert sampling.forgotten[-1] == state_path
    count = len(sampling.forgotten)
    request = urllib.request.Request(f"{base}/api/v1/training_runs/{model_id}/checkpoints/sampler_weights/kept",
                                     method="DELETE", headers={"X-API-Key": KEY})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
    assert sampling.forgotten[count:] == [path]
