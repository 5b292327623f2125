"""forge-tinker as a real process, driven over raw HTTP the way a careless or hostile client would: every request
needs a 'tml-' key; bad bodies (wrong types, protobuf garbage, oversized, unknown losses, traversal paths, unknown
or other keys' ids) answer a 4xx with the SDK's error shape (or a user-category failure of their future) and change
nothing; the server stays up and keeps serving the good requests around them. The SDK-driven protocol test is
tests/tinker/test_protocol_sdk.py (make test-tinker)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from forge.v1 import tinker_wire_pb2 as pb

from helpers.processes import Service

KEY_A, KEY_B = "tml-team-a", "tml-team-b"
PROTOBUF = "application/x-protobuf"
TOKENS = [5, 17, 42, 99, 7, 250, 3]


class Client:
    def __init__(self, base_url: str, key: str | None) -> None:
        self.base_url, self.key = base_url, key

    def call(self, method: str, path: str, body: object = None, raw: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, object]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": content_type, **({"X-API-Key": self.key} if self.key else {})}
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                status, payload, kind = reply.status, reply.read(), reply.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, payload, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        return status, (payload if PROTOBUF in kind else json.loads(payload or b"null"))

    def post(self, path: str, body: object = None, **kwargs) -> tuple[int, object]:
        return self.call("POST", "/api/v1/" + path, body, **kwargs)

    def get(self, path: str) -> tuple[int, object]:
        return self.call("GET", "/api/v1/" + path)

    def result(self, request_id: str) -> object:
        """A future's outcome (JSON, or protobuf bytes), polling through try_again."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, reply = self.post("retrieve_future", {"request_id": request_id})
            assert status == 200, reply
            if not (isinstance(reply, dict) and reply.get("type") == "try_again"):
                return reply
        raise TimeoutError(request_id)


def forward_body(model_id: str, seq_id: int, loss_fn: str = "cross_entropy", tokens: list[int] = TOKENS) -> bytes:
    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn=loss_fn)
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(tokens[:-1], dtype="<i4").tobytes()
    for name, values, dtype, code in (("target_tokens", tokens[1:], "<i8", pb.DTYPE_INT64),
                                      ("weights", [1.0] * (len(tokens) - 1), "<f4", pb.DTYPE_FLOAT32)):
        datum.loss_fn_inputs[name].dense = np.asarray(values, dtype=dtype).tobytes()
        datum.loss_fn_inputs[name].dtype = code
        datum.loss_fn_inputs[name].shape.append(len(values))
    return message.SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory: Path = tmp_path_factory.mktemp("tinker")
    service = Service("tinker", "forge-tinker", ["--port", "0", "--grpc-port", "0", "--api-key", KEY_A,
                                                 "--api-key", KEY_B, "--run-dir", str(directory / "models"),
                                                 "--max-body-mb", "1", "--poll-hold", "5"], directory, timeout_s=120)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def team_a(server):
    """Team A's session and model (trained one step, saved as 'first'), made through raw HTTP."""
    client = Client(server.info["base_url"], KEY_A)
    status, session = client.post("create_session", {"tags": [], "user_metadata": {}, "sdk_version": "raw"})
    assert status == 200, session
    status, created = client.post("create_model", {"session_id": session["session_id"], "model_seq_id": 0,
                                                   "base_model": "tiny", "lora_config": {"rank": 4, "seed": 0}})
    assert status == 200, created
    model_id = client.result(created["request_id"])["model_id"]
    status, accepted = client.post("forward_backward", raw=forward_body(model_id, 1), content_type=PROTOBUF)
    assert status == 200, accepted
    output = pb.ForwardBackwardOutput.FromString(client.result(accepted["request_id"]))
    assert "loss:sum" in output.metrics and output.loss_fn_outputs[0].num_datums == 1
    status, saved = client.post("save_weights", {"model_id": model_id, "path": "first", "seq_id": 2})
    path = client.result(saved["request_id"])["path"]
    assert path == f"tinker://{model_id}/weights/first"
    return client, session["session_id"], model_id, path


def test_every_request_needs_a_known_key_but_health(server):
    base = server.info["base_url"]
    assert Client(base, None).get("healthz") == (200, {"status": "ok"})
    for key in (None, "tml-unknown", "not-a-tinker-key"):
        status, reply = Client(base, key).post("create_session", {"tags": [], "sdk_version": "x"})
        assert status == 401 and reply["category"] == "user"
    status, config = Client(base, KEY_A).post("client/config", {"sdk_version": "0.38.0"})
    assert status == 200 and config["pjwt_auth_enabled"] is False and config["use_pyqwest_transport"] is False


def test_bad_requests_answer_4xx_and_change_nothing(server, team_a):
    client, session_id, model_id, path = team_a
    big = 2 * 1024 * 1024
    bad = [
        ("create_session", {"tags": "not-a-list", "sdk_version": "x"}),
        ("create_session", {"tags": [1, 2], "sdk_version": "x"}),
        ("create_model", {"session_id": session_id, "model_seq_id": "one", "base_model": "tiny",
                          "lora_config": {"rank": 4}}),
        ("create_model", {"session_id": session_id, "model_seq_id": 9, "base_model": "tiny",
                          "lora_config": {"rank": 0}}),
        ("create_model", {"session_id": session_id, "model_seq_id": 9, "base_model": "tiny",
                          "lora_config": {"rank": True}}),
        ("create_model", {"session_id": session_id, "model_seq_id": 9, "base_model": "tiny"}),
        ("create_model", {"session_id": session_id, "model_seq_id": 9, "base_model": "/etc",
                          "lora_config": {"rank": 4}}),
        ("create_model", {"session_id": "sess-unknown", "model_seq_id": 9, "base_model": "tiny",
                          "lora_config": {"rank": 4}}),
        ("create_model", {"session_id": session_id, "model_seq_id": 9, "base_model": "tiny",
                          "lora_config": {"rank": 4}, "optimizer_config": {"type": "dimuon"}}),
        ("get_info", {"model_id": "no-such-model"}),
        ("get_info", {"model_id": ["list"]}),
        ("get_info", [1, 2, 3]),
        ("optim_step", {"model_id": model_id, "seq_id": 50, "adam_params": {"learning_rate": "fast"}}),
        ("optim_step", {"model_id": model_id, "seq_id": 50, "adam_params": {"beta1": 1.5}}),
        ("optim_step", {"model_id": model_id, "seq_id": 50, "adam_params": {"learning_rate": -1}}),
        ("optim_step", {"model_id": model_id, "seq_id": 50, "optimizer_params": {"type": "dimuon"}}),
        ("optim_step", {"model_id": model_id, "seq_id": 50, "adam_params": {}}),         # a refused turn
        ("optim_step", {"model_id": model_id, "seq_id": 10**9, "adam_params": {}}),      # far ahead
        ("save_weights", {"model_id": model_id, "seq_id": 50, "path": "../escape"}),
        ("save_weights", {"model_id": model_id, "seq_id": 50, "path": "a/b"}),
        ("save_weights", {"model_id": model_id, "seq_id": 50, "path": ".hidden"}),
        ("save_weights", {"model_id": model_id, "seq_id": 50, "path": "x" * 300}),
        ("load_weights", {"model_id": model_id, "seq_id": 50, "path": "tinker://../../etc/weights/x",
                          "optimizer": False}),
        ("load_weights", {"model_id": model_id, "seq_id": 50, "path": f"tinker://{model_id}/weights/../../x",
                          "optimizer": False}),
        ("load_weights", {"model_id": model_id, "seq_id": 50, "path": "/tmp/weights", "optimizer": False}),
        ("load_weights", {"model_id": model_id, "seq_id": 50, "path": f"tinker://{model_id}/other/x",
                          "optimizer": False}),
        ("load_weights", {"model_id": model_id, "seq_id": 50, "path": path, "optimizer": "yes"}),
        ("save_weights_for_sampler", {"model_id": model_id, "seq_id": 50}),
        ("create_sampling_session", {"session_id": session_id, "sampling_session_seq_id": 0,
                                     "base_model": "gpt-unknown"}),
        ("create_sampling_session", {"session_id": session_id, "sampling_session_seq_id": 0,
                                     "model_path": "tinker://x/sampler_weights/../y"}),
        ("asample", {"sampling_session_id": "nope", "prompt": {"chunks": []}, "sampling_params": {}}),
        ("retrieve_future", {"request_id": "req-unknown"}),
        ("retrieve_future", {"request_id": 7}),
        ("session_heartbeat", {"session_id": "sess-unknown"}),
        ("weights_info", {"tinker_path": "tinker://a/b"}),
        ("weights_info", {"tinker_path": f"tinker://{model_id}/weights/missing"}),
        ("telemetry", b"{not json"),
        ("telemetry", b"x" * big),
    ]
    for endpoint, body in bad:
        raw = body if isinstance(body, bytes) else None
        status, reply = client.post(endpoint, None if raw else body, raw=raw)
        assert 400 <= status < 500, (endpoint, body, status, reply)
        assert isinstance(reply, dict) and reply.get("category") == "user" and reply.get("error"), (endpoint, reply)
    garbage = [b"\xff\x00\x13garbage", forward_body(model_id, 60, loss_fn="made_up_loss"),
               forward_body("no-such-model", 61), forward_body(model_id, 62, tokens=[1]),
               pb.ForwardBackwardRequest(model_id=model_id, seq_id=63, loss_fn="cross_entropy").SerializeToString()]
    for raw in garbage:
        status, reply = client.post("forward_backward", raw=raw, content_type=PROTOBUF)
        assert 400 <= status < 500 and reply["category"] == "user", reply
    status, reply = client.post("forward_backward", raw=forward_body(model_id, 64), content_type="application/json")
    assert status == 415
    for path_ in ("training_runs/no-such-model", "training_runs/no-such-model/checkpoints", "samplers/nope",
                  "training_runs?limit=0", "training_runs?limit=abc"):
        status, reply = client.get(path_)
        assert 400 <= status < 500, (path_, reply)
    status, _ = client.call("DELETE", f"/api/v1/training_runs/{model_id}/checkpoints/weights/missing")
    assert status == 404
    assert client.get("healthz")[0] == 200
    status, checkpoints = client.get(f"training_runs/{model_id}/checkpoints")
    assert status == 200 and [c["checkpoint_id"] for c in checkpoints["checkpoints"]] == ["weights/first"]


def test_another_keys_models_and_checkpoints_read_as_absent(server, team_a):
    client, session_id, model_id, path = team_a
    other = Client(server.info["base_url"], KEY_B)
    assert other.post("get_info", {"model_id": model_id})[0] == 404
    assert other.post("optim_step", {"model_id": model_id, "seq_id": 5, "adam_params": {}})[0] == 404
    assert other.post("forward_backward", raw=forward_body(model_id, 5), content_type=PROTOBUF)[0] == 404
    assert other.get(f"training_runs/{model_id}")[0] == 404
    assert other.get(f"training_runs/{model_id}/checkpoints")[0] == 404
    assert other.post("weights_info", {"tinker_path": path})[0] == 404
    assert other.call("DELETE", f"/api/v1/training_runs/{model_id}/checkpoints/weights/first")[0] == 404
    assert other.post("session_heartbeat", {"session_id": session_id})[0] == 404
    assert other.get("training_runs")[1]["training_runs"] == []
    status, session = other.post("create_session", {"tags": [], "sdk_version": "raw"})
    status, load = other.post("load_weights", {"session_id": session["session_id"], "model_seq_id": 0, "path": path,
                                               "optimizer": True})
    assert status == 200
    failed = other.result(load["request_id"])
    assert failed["category"] == "user" and "not found" in failed["error"]
    assert other.post("get_info", {"model_id": load["model_id"]})[0] == 404
    # Team A still has everything.
    assert client.post("get_info", {"model_id": model_id})[0] == 200
    status, runs = client.get("training_runs")
    assert [r["training_run_id"] for r in runs["training_runs"]] == [model_id]


def test_requests_run_in_seq_order_and_a_repeat_answers_the_first(server, team_a):
    client, _, model_id, _ = team_a
    assert client.post("get_info", {"model_id": model_id})[0] == 200
    # seq 4 arrives before seq 3: it waits for it; the repeat of seq 3 gets the same future.
    status, later = client.post("save_weights", {"model_id": model_id, "path": "second", "seq_id": 4})
    assert status == 200
    status, sooner = client.post("forward_backward", raw=forward_body(model_id, 3), content_type=PROTOBUF)
    status, again = client.post("forward_backward", raw=forward_body(model_id, 3), content_type=PROTOBUF)
    assert again["request_id"] == sooner["request_id"]
    assert isinstance(client.result(sooner["request_id"]), bytes)
    assert client.result(later["request_id"])["path"].endswith("/weights/second")
    scrape = urllib.request.Request(client.base_url + "/metrics", headers={"X-API-Key": KEY_A})
    with urllib.request.urlopen(scrape, timeout=30) as reply:
        assert b"forge_" in reply.read()
