"""forge-tinker --nproc 2 (two training ranks under torchrun, gloo on CPU, the base sharded with FSDP2) against
forge-tinker --nproc 1, both real processes driven over raw HTTP the same way: a batch of several datums sharing
prefixes, a few forward_backward + optim_step calls, a forward, save_weights, load_weights (with the optimizer) and
the step after it taken again: every loss and log-probability equal within 1e-5, every saved adapter weight
within 1 % of the learning rate. A request that is wrong is refused on rank 0 and the ranks go on; a rank that dies
stops the server with a failed status."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from forge.reaper import child_pids
from forge.v1 import tinker_wire_pb2 as pb

from conftest import HELPERS
from helpers.processes import Service, wait_gone

pytestmark = pytest.mark.xdist_group("serial")

KEY = "tml-ranks"
PROTOBUF = "application/x-protobuf"
VOCAB = 1000
STEPS = 3
TOLERANCE = 1e-5
LEARNING_RATE = 0.01
# Adapter weights after Adam steps: an element whose gradient is near zero moves by a near-random fraction of the
# learning rate, so float32 sums in another order (two ranks) move it differently by up to ~1e-3 of it. Losses,
# log-probabilities and gradient norms keep TOLERANCE; a sharding bug moves weights by the learning rate itself.
ADAPTER_TOLERANCE = LEARNING_RATE / 100


class Client:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def post(self, path: str, body: object = None, raw: bytes | None = None) -> tuple[int, object]:
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"Content-Type": PROTOBUF if raw is not None else "application/json", "X-API-Key": KEY}
        request = urllib.request.Request(f"{self.base_url}/api/v1/{path}", data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                status, payload, kind = reply.status, reply.read(), reply.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, payload, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        return status, (payload if PROTOBUF in kind else json.loads(payload or b"null"))

    def run(self, path: str, body: object = None, raw: bytes | None = None) -> object:
        """Send a request and wait for its future's outcome."""
        status, accepted = self.post(path, body, raw)
        assert status == 200, accepted
        for _ in range(1000):
            status, reply = self.post("retrieve_future", {"request_id": accepted["request_id"]})
            assert status == 200, reply
            if not (isinstance(reply, dict) and reply.get("type") == "try_again"):
                return reply
        raise AssertionError(f"{path} never finished")


def batch(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, weights) of six datums: two prompts, three completions each (shared prefixes), lengths unequal."""
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(2):
        prompt = rng.integers(0, VOCAB, 10)
        for _ in range(3):
            sequence = np.concatenate([prompt, rng.integers(0, VOCAB, int(rng.integers(2, 9)))])
            data.append((sequence, rng.random(len(sequence) - 1).astype(np.float32)))
    return data


def forward_body(model_id: str, seq_id: int, data: list[tuple[np.ndarray, np.ndarray]],
                 forward_only: bool = False) -> bytes:
    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy",
                                        forward_only=forward_only)
    for tokens, weights in data:
        datum = message.data.add()
        datum.model_input.add().encoded_text.tokens = np.asarray(tokens[:-1], dtype="<i4").tobytes()
        for name, values, dtype, code in (("target_tokens", tokens[1:], "<i8", pb.DTYPE_INT64),
                                          ("weights", weights, "<f4", pb.DTYPE_FLOAT32)):
            datum.loss_fn_inputs[name].dense = np.asarray(values, dtype=dtype).tobytes()
            datum.loss_fn_inputs[name].dtype = code
            datum.loss_fn_inputs[name].shape.append(len(values))
    return message.SerializeToString()


def outputs(reply: bytes) -> dict[str, object]:
    """A forward pass's loss:sum and its per-datum logprobs and elementwise losses."""
    message = pb.ForwardBackwardOutput.FromString(reply)
    found: dict[str, object] = {"loss": message.metrics["loss:sum"]}
    for name in ("logprobs", "elementwise_loss"):
        arrays = []
        for record in message.loss_fn_outputs:
            field = record.fields[name]
            offsets = np.frombuffer(field.offsets, dtype="<i8")
            values = np.frombuffer(field.data, dtype="<f4")
            arrays += [values[a // 4:b // 4] for a, b in itertools.pairwise(offsets)]
        found[name] = arrays
    return found


def drive(server: Service) -> dict[str, object]:
    """The same calls on either server: what each answered, and the adapters it saved."""
    client = Client(server.info["base_url"])
    status, session = client.post("create_session", {"tags": [], "user_metadata": {}, "sdk_version": "raw"})
    assert status == 200, session
    created = client.run("create_model", {"session_id": session["session_id"], "model_seq_id": 0,
                                          "base_model": "tiny", "lora_config": {"rank": 4, "seed": 7}})
    model_id, data, seq, seen = created["model_id"], batch(), 0, {}

    def step(label: str) -> None:
        nonlocal seq
        seen[label] = outputs(client.run("forward_backward", raw=forward_body(model_id, seq := seq + 1, data)))
        optim = client.run("optim_step", {"model_id": model_id, "seq_id": (seq := seq + 1),
                                          "adam_params": {"learning_rate": LEARNING_RATE, "grad_clip_norm": 1.0}})
        seen[f"{label}/grad_norm"] = optim["metrics"]["grad_norm:mean"]

    for n in range(STEPS - 1):
        step(f"step{n}")
    saved = client.run("save_weights", {"model_id": model_id, "path": "mid", "seq_id": (seq := seq + 1)})
    step("last")
    seen["forward"] = outputs(client.run("forward_backward", raw=forward_body(model_id, seq := seq + 1, data, True)))
    seen["alone"] = outputs(client.run("forward_backward",              # one datum: the other rank runs idle passes
                                       raw=forward_body(model_id, seq := seq + 1, data[3:4], True)))
    wrong = [(np.array([1, 2**30, 2]), np.ones(2, dtype=np.float32))]        # a token past the vocabulary
    refused = client.run("forward_backward", raw=forward_body(model_id, seq := seq + 1, wrong))
    assert refused["category"] == "user" and "vocab" in json.dumps(refused).lower(), refused
    client.run("save_weights", {"model_id": model_id, "path": "after", "seq_id": (seq := seq + 1)})
    client.run("load_weights", {"model_id": model_id, "path": saved["path"], "optimizer": True,
                                "seq_id": (seq := seq + 1)})
    step("again")                       # the last step, taken again from the loaded state
    client.run("save_weights", {"model_id": model_id, "path": "again", "seq_id": (seq := seq + 1)})
    root = Path(server.info["run_dir"]) / "models" / model_id / "weights"
    for name in ("mid", "after", "again"):
        seen[f"adapter/{name}"] = load_file(str(root / name / "adapter_model.safetensors"))
    return seen


def start(directory: Path, nproc: int) -> Service:
    directory.mkdir(parents=True, exist_ok=True)
    run_dir = directory / f"nproc{nproc}"
    service = Service(f"tinker-{nproc}", "forge-tinker",
                      ["--port", "0", "--grpc-port", "0", "--api-key", KEY, "--run-dir", str(run_dir),
                       "--device", "cpu", "--token-budget", "16", "--nproc", str(nproc), "--poll-hold", "5",
                       "--collective-timeout-s", "120"], directory, timeout_s=300)
    service.info["run_dir"] = str(run_dir)
    return service


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tinker-ranks")


@pytest.fixture(scope="module")
def servers(directory):
    one = start(directory, 1)
    two = None
    try:
        two = start(directory, 2)
        yield one, two
    finally:
        for service in (two, one):
            if service is not None and service.alive:
                service.stop()


def assert_close(one: object, two: object, what: str) -> None:
    if isinstance(one, dict):
        assert one.keys() == two.keys(), what
        for key in one:
            assert_close(one[key], two[key], f"{what}/{key}")
    elif isinstance(one, list):
        assert len(one) == len(two), what
        for i, (a, b) in enumerate(zip(one, two, strict=True)):
            assert_close(a, b, f"{what}[{i}]")
    else:
        atol = ADAPTER_TOLERANCE if "adapter/" in what else TOLERANCE
        np.testing.assert_allclose(np.asarray(two, dtype=np.float64), np.asarray(one, dtype=np.float64),
                                   rtol=TOLERANCE, atol=atol, err_msg=what)


def ranks_of(service: Service) -> list[int]:
    """The pids of a forge-tinker's ranks (the children of its torchrun agent)."""
    return [pid for agent in child_pids(service.proc.pid) for pid in child_pids(agent)]


def test_two_ranks_train_as_one(servers):
    one, two = servers
    seen_one, seen_two = drive(one), drive(two)
    assert_close(seen_one, seen_two, "nproc 2 against nproc 1")
    assert seen_two["step0"]["loss"] > seen_two["last"]["loss"]                 # it trains
    assert_close(seen_two["last"], seen_two["again"], "the step after load_weights")
    assert_close(seen_two["adapter/after"], seen_two["adapter/again"], "the adapter after it")


def test_prompt_logprobs_on_two_ranks(tmp_path):
    """Prompt log-probabilities (the sharded base's forward on every rank) under the base and a sampler's weights,
    driven in-process on two ranks, equal one process's."""
    out = tmp_path / "answers.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(HELPERS / "tinker_ranks_prompt.py"), str(tmp_path), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    answers = json.loads(out.read_text())
    assert_close(answers["one"], answers["ranks"], "prompt log-probs on 2 ranks against 1")


def test_a_stop_signal_stops_every_rank(servers):
    _, two = servers
    ranks = ranks_of(two)
    assert len(ranks) == 2
    assert two.stop() == 0, two.log_text()[-3000:]
    wait_gone(ranks)


def test_a_rank_that_dies_stops_the_server(directory):
    two = start(directory / "dies", 2)
    try:
        follower = next(pid for pid in ranks_of(two)
                        if "\0RANK=1\0" in "\0" + Path(f"/proc/{pid}/environ").read_text("latin-1"))
        os.kill(follower, signal.SIGKILL)
        status = two.proc.wait(timeout=180)
        assert status != 0, "forge-tinker ended as if nothing failed after a training rank died"
        assert "the training ranks failed" in two.log_text()
    finally:
        if two.alive:
            two.stop()
