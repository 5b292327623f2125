"""A Hugging Face id as a Tinker base model, end to end, against a stand-in Hub on a loopback port
(helpers/hub_server.py: huggingface_hub's real download code, no network). The model is a Llama, a family Forge
trains through transformers, with random weights and the built-in model's tokenizer.

``forge-tinker --base-model ORG/NAME`` fetches the model into huggingface_hub's cache before it serves (as the entry
points a user runs do: forge up, forge rollout), and a client trains it over raw HTTP: the loss falls, the output
head's adapter (``train_unembed``) among what trains. Started again with ``HF_HUB_OFFLINE=1`` and the Hub gone, it
serves the same model from the cache; the model's ``tokenizer_id`` is the id itself, which
``AutoTokenizer.from_pretrained`` (what the SDK's ``get_tokenizer`` calls; the SDK itself too where its environment
is given, FORGE_TINKER_PYTHON) loads from the same cache as the tokenizer the server has. A model that cannot be had stops the server at start in one line (exit status 2); one that leaves the
cache after the start is refused at ``create_model`` with a user error naming the id and the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
from safetensors.numpy import load_file

from forge.learner.tinker.training import LearnerTraining
from forge.learner.tinker.types import LoraSpec, UserError
from forge.v1 import tinker_wire_pb2 as pb

from conftest import free_port, script
from helpers.families import SMALL, with_tiny_tokenizer, write_family
from helpers.hub_server import HubServer, hub_env
from helpers.processes import Service

MODEL = "org/llama-random"
KEY = "tml-hub-team"
PROTOBUF = "application/x-protobuf"
TOKENS = [5, 17, 42, 99, 7, 250, 3, 812, 64]
FETCHED = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
           "chat_template.jinja"}
TEXT = "The quick brown fox: 12 + 30 = 42."


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> Path:
    """The Hub's repositories: MODEL, a random Llama written by transformers, the built-in tokenizer beside it."""
    root = tmp_path_factory.mktemp("hub")
    directory, _ = write_family(root / MODEL, "llama", seed=7, shape={**SMALL, "vocab_size": 1024})
    with_tiny_tokenizer(directory)
    (directory / "README.md").write_text(f"# {MODEL}\n")          # on the Hub, not fetched
    return root


class Client:
    """The Tinker API over raw HTTP with one key."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def post(self, path: str, body: object = None, raw: bytes | None = None) -> object:
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"Content-Type": PROTOBUF if raw is not None else "application/json", "X-API-Key": KEY}
        request = urllib.request.Request(f"{self.base_url}/api/v1/{path}", data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                payload, kind = reply.read(), reply.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path}: HTTP {exc.code} {exc.read()[:500]!r}") from None
        return payload if PROTOBUF in kind else json.loads(payload)

    def result(self, accepted: object) -> object:
        """The outcome of the future ``accepted`` names, polled through try_again."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            reply = self.post("retrieve_future", {"request_id": accepted["request_id"]})
            if not (isinstance(reply, dict) and reply.get("type") == "try_again"):
                assert not (isinstance(reply, dict) and "error" in reply), reply
                return reply
        raise TimeoutError(accepted)


def forward_body(model_id: str, seq_id: int) -> bytes:
    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(TOKENS[:-1], dtype="<i4").tobytes()
    for name, values, dtype, code in (("target_tokens", TOKENS[1:], "<i8", pb.DTYPE_INT64),
                                      ("weights", [1.0] * (len(TOKENS) - 1), "<f4", pb.DTYPE_FLOAT32)):
        datum.loss_fn_inputs[name].dense = np.asarray(values, dtype=dtype).tobytes()
        datum.loss_fn_inputs[name].dtype = code
        datum.loss_fn_inputs[name].shape.append(len(values))
    return message.SerializeToString()


def start(directory: Path, env: dict[str, str]) -> Service:
    args = ["--port", "0", "--grpc-port", "0", "--api-key", KEY, "--run-dir", str(directory / "run"), "--base-model",
            MODEL, "--device", "cpu", "--poll-hold", "5"]
    return Service("tinker", "forge-tinker", args, directory, env=env, inherit_env=False, timeout_s=300)


def train(server: Service, steps: int) -> tuple[dict, list[float], Path]:
    """A model on MODEL (attention, MLP and output head adapted) trained ``steps`` steps on one sequence and saved:
    its info, the loss before each step, and the saved adapter's weights file."""
    client = Client(server.info["base_url"])
    session = client.post("create_session", {"tags": [], "user_metadata": {}, "sdk_version": "raw"})
    lora = {"rank": 4, "seed": 0, "train_attn": True, "train_mlp": True, "train_unembed": True}
    model_id = client.result(client.post("create_model", {"session_id": session["session_id"], "model_seq_id": 0,
                                                          "base_model": MODEL, "lora_config": lora}))["model_id"]
    info = client.post("get_info", {"model_id": model_id})
    losses = []
    for step in range(steps):
        output = pb.ForwardBackwardOutput.FromString(client.result(client.post(
            "forward_backward", raw=forward_body(model_id, 2 * step + 1))))
        losses.append(output.metrics["loss:sum"])
        client.result(client.post("optim_step", {"model_id": model_id, "seq_id": 2 * step + 2,
                                                 "adam_params": {"learning_rate": 0.05}}))
    saved = client.result(client.post("save_weights", {"model_id": model_id, "path": "last", "seq_id": 2 * steps + 1}))
    assert saved["path"] == f"tinker://{model_id}/weights/last"
    return info, losses, server.ready_file.parent / "run" / "models" / model_id / "weights" / "last"


def snapshot_of(home: Path) -> Path:
    (directory,) = (home / "hub" / "models--org--llama-random" / "snapshots").iterdir()
    return directory


@pytest.mark.timeout(900)
def test_a_hub_model_is_fetched_at_start_trained_and_served_offline_from_the_cache(repos, tmp_path):
    home = tmp_path / "hf"
    with HubServer(repos, tmp_path / "hub-server") as hub:
        server = start(tmp_path / "online", hub_env(home, hub.url))
        try:
            fetched = len(hub.requests())
            info, losses, saved = train(server, steps=4)
        finally:
            server.stop()
        assert fetched and len(hub.requests()) == fetched                  # fetched at start, before any client
        assert all(request["status"] == 200 for request in hub.requests())
    snapshot = snapshot_of(home)
    assert {p.name for p in snapshot.iterdir()} == FETCHED                # what Forge loads, no README
    assert info["model_data"] == {"arch": None, "model_name": MODEL, "tokenizer_id": MODEL}
    assert losses[-1] < losses[0] - 0.5, losses
    head_b = load_file(str(saved / "adapter_model.safetensors"))["base_model.model.lm_head.lora_B.weight"]
    assert head_b.shape == (1024, 4) and np.abs(head_b).max() > 0         # the head's adapter trained

    offline = hub_env(home, hub.url, HF_HUB_OFFLINE="1")                  # the Hub is gone: the cache alone serves
    server = start(tmp_path / "offline", offline)
    try:
        again, first, _ = train(server, steps=1)
        clients = client_tokenizations(server, offline)
    finally:
        server.stop()
    assert again["model_data"]["tokenizer_id"] == MODEL
    assert first[0] == pytest.approx(losses[0], rel=1e-5)                 # the same model, the same first step
    assert snapshot_of(home) == snapshot
    from tokenizers import Tokenizer

    served = Tokenizer.from_file(str(snapshot / "tokenizer.json")).encode(TEXT, add_special_tokens=False).ids
    assert len(served) > 5 and all(ids == served for ids in clients.values()), (served, clients)


# What the SDK's get_tokenizer does with get_info's tokenizer_id (AutoTokenizer.from_pretrained(tokenizer_id,
# fast=True)), and, where the SDK's environment is given, the SDK itself: the ids of TEXT, as JSON.
AUTO_TOKENIZER = ("import json, sys; from transformers import AutoTokenizer; "
                  "t = AutoTokenizer.from_pretrained(sys.argv[1], fast=True); "
                  "print(json.dumps(t(sys.argv[2], add_special_tokens=False)['input_ids']))")
SDK = ("import json, sys, tinker; "
       "training = tinker.ServiceClient().create_lora_training_client(base_model=sys.argv[1], rank=4, seed=0); "
       "assert training.get_info().model_data.tokenizer_id == sys.argv[1]; "
       "print(json.dumps(training.get_tokenizer().encode(sys.argv[2], add_special_tokens=False)))")


def client_tokenizations(server: Service, env: dict[str, str]) -> dict[str, list[int]]:
    """TEXT's ids as a client on this machine, sharing its Hugging Face cache and settings, tokenizes it."""
    programs = {"transformers": (sys.executable, AUTO_TOKENIZER, MODEL)}
    if os.environ.get("FORGE_TINKER_PYTHON"):
        programs["tinker SDK"] = (os.environ["FORGE_TINKER_PYTHON"], SDK, MODEL)
    found = {}
    for name, (python, code, argument) in programs.items():
        done = subprocess.run([python, "-c", code, argument, TEXT], capture_output=True, text=True, timeout=300,
                              env={**env, "TINKER_BASE_URL": server.info["base_url"], "TINKER_API_KEY": KEY})
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        found[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def hub(repos, tmp_path_factory):
    with HubServer(repos, tmp_path_factory.mktemp("hub-server")) as server:
        yield server


@pytest.mark.parametrize("case", ["offline, empty cache", "no such model", "no Hub, empty cache"])
def test_a_base_model_that_cannot_be_had_stops_the_server_at_start(hub, tmp_path, case):
    home, url, model, variables = tmp_path / "hf", hub.url, MODEL, {}
    cache = f"the Hugging Face cache ({home / 'hub'})"
    if case == "offline, empty cache":
        variables = {"HF_HUB_OFFLINE": "1"}
        expected = (f"it is not in {cache}, and HF_HUB_OFFLINE forbids fetching it: fetch it where the Hub can be "
                    "reached, or unset HF_HUB_OFFLINE")
    elif case == "no such model":
        model = "org/no-such-model"
        expected = f"no such model on the Hub ({url}) (if it is private, set HF_TOKEN to a token that may read it)"
    else:
        url = f"http://127.0.0.1:{free_port()}"                         # nothing listens there
        expected = f"the Hub ({url}) cannot be reached (ConnectError), and it is not in {cache}: check the network " \
                   "or HF_ENDPOINT"
    result = subprocess.run([script("forge-tinker"), "--api-key", KEY, "--base-model", "tiny", "--base-model", model,
                             "--run-dir", str(tmp_path / "run"), "--port", "0", "--grpc-port", "0"],
                            env=hub_env(home, url, **variables), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == f"Error: {model}: {expected}"
    assert "Traceback" not in result.stderr


def test_a_hub_model_gone_from_the_cache_is_refused_at_create_model(tmp_path, monkeypatch):
    """What a server whose cache lost the model after its start answers (the registry's models likewise): a user
    error naming the id and the cache, never a server error."""
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    training = LearnerTraining(tmp_path / "run")
    with pytest.raises(UserError) as refused:
        training.create_model("alice", MODEL, LoraSpec(rank=4, seed=0))
    assert str(refused.value) == (f"base model {MODEL}: not in the Hugging Face cache ({cache}): fetch it first with "
                                  f"`forge model fetch {MODEL}`")
    assert training.models("alice") == [] and list((tmp_path / "run" / "models").glob("*/model.json")) == []
