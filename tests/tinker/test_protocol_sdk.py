"""forge-tinker driven by the official tinker SDK alone (tests/tinker/programs/protocol.py, run in the SDK's own
environment): every endpoint a training-only server answers, with the SDK's own request and reply shapes, a batch
split into several requests, paths, listings, resume and a refused loss."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.processes import Service

pytestmark = pytest.mark.tinker
PROGRAMS = Path(__file__).parent / "programs"
KEY = "tml-protocol-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tinker")
    service = Service("tinker", "forge-tinker", ["--port", "0", "--grpc-port", "0", "--api-key", KEY,
                                                 "--run-dir", str(directory / "models")], directory, timeout_s=120)
    yield service
    service.stop()


def run_program(server: Service, name: str, *args: str) -> dict:
    python = os.environ["FORGE_TINKER_PYTHON"]
    env = {**os.environ, "TINKER_BASE_URL": server.info["base_url"], "TINKER_API_KEY": KEY}
    done = subprocess.run([python, str(PROGRAMS / name), *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=PROGRAMS)
    assert done.returncode == 0, done.stderr[-4000:] + "\n" + server.log_text()[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_sdk_drives_every_training_endpoint(server):
    seen = run_program(server, "protocol.py", "tiny")
    model_id = seen["model_id"]
    assert seen["models"] == ["tiny"]
    assert seen["info"]["model_id"] == model_id and seen["info"]["lora_rank"] == 4 and seen["info"]["is_lora"]
    assert seen["split_outputs"] == 1100 and abs(seen["split_loss_ratio"] - 1100) < 1e-3
    assert seen["forward_logprobs"] == pytest.approx(seen["forward_backward_logprobs"], abs=1e-5)
    assert "learning_rate:mean" in seen["optim_metrics"]
    assert seen["state_path"] == f"tinker://{model_id}/weights/step-1"
    assert seen["sampler_path"] == f"tinker://{model_id}/sampler_weights/sampler-1"
    assert model_id in seen["runs"] and seen["run_of_path"] == model_id
    assert seen["checkpoints"] == ["sampler_weights/sampler-1", "weights/step-1"]
    assert seen["weights_info"]["base_model"] == "tiny" and seen["weights_info"]["lora_rank"] == 4
    assert seen["resumed_model_id"].endswith(":train:1")
    assert seen["resumed_loss"] == pytest.approx(seen["trained_loss"], rel=1e-5)
    assert seen["after_delete"] == ["weights/step-1"]
    assert seen["refused"] == "BadRequestError"
    assert server.alive
