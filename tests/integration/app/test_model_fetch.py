"""Models named by Hugging Face id through the programs, against a stand-in Hub on a loopback port
(helpers/hub_server.py: huggingface_hub's real download code, no network): ``forge model fetch`` downloads what Forge
loads and prints the directory, ``forge model check`` runs on it, both again offline from the cache with the Hub
gone; every way a model cannot be had fails in one line with exit status 2; and the services never fetch, they only
read the cache."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import huggingface_hub.constants
import pytest

from forge.checkpoints import cached_model
from forge.gateway.modelinfo import ModelInfo

from conftest import free_port, script
from helpers.hub_server import HubServer, hub_env, write_model_repo

MODEL, GATED = "org/tiny-random", "org/tiny-gated"
TOKEN = "hf_test_token"
FETCHED = {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors"}


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    write_model_repo(root, MODEL, seed=1)
    write_model_repo(root, GATED, seed=2)
    return root


@pytest.fixture(scope="module")
def hub(repos, tmp_path_factory):
    """The stand-in Hub for the module's tests, GATED gated behind TOKEN."""
    with HubServer(repos, tmp_path_factory.mktemp("hub-server"), gated=(GATED,), tokens=(TOKEN,)) as server:
        yield server


def forge(*args: str, env: dict[str, str], program: str = "forge") -> subprocess.CompletedProcess:
    return subprocess.run([script(program), *args], capture_output=True, text=True, timeout=600, env=env)


def checked(model: str, env: dict[str, str]) -> dict:
    result = forge("model", "check", model, "--json", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.timeout(600)
def test_fetch_and_check_through_the_hub_then_offline_from_the_cache(repos, tmp_path, monkeypatch):
    home = tmp_path / "hf"
    with HubServer(repos, tmp_path / "server") as server:
        env = hub_env(home, server.url)
        fetched = forge("model", "fetch", MODEL, env=env)
        assert fetched.returncode == 0, fetched.stderr
        assert fetched.stderr == "" and len(fetched.stdout.splitlines()) == 1       # quiet: one line, the directory
        directory = Path(fetched.stdout.strip())
        assert directory.parent.parent == home / "hub" / "models--org--tiny-random"
        assert {p.name for p in directory.iterdir()} == FETCHED           # no .bin, .onnx, README or sub-folder
        report = checked(MODEL, env)
        assert report["ok"] and report["model"] == str(directory) and report["training_path"] == "forge"
        served = len(server.requests())
    assert served and all(r["status"] == 200 for r in server.requests())

    offline = hub_env(home, server.url, HF_HUB_OFFLINE="1")           # the Hub is gone: the cache alone serves
    commit = directory.name
    for model in (MODEL, f"{MODEL}@{commit}", f"{MODEL}@main"):
        again = forge("model", "fetch", model, env=offline)
        assert again.returncode == 0 and again.stdout == f"{directory}\n", again.stderr
    assert checked(f"{MODEL}@{commit}", offline)["ok"]

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))    # as a service reads it
    assert cached_model(MODEL).directory == directory
    info = ModelInfo.load(MODEL)
    assert info.model_id == MODEL and info.directory == directory       # the id is what the gateway serves under


def test_a_gated_model_needs_a_token(hub, tmp_path):
    refused = forge("model", "fetch", GATED, env=hub_env(tmp_path / "hf", hub.url))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"Error: {GATED}: a gated model: accept its conditions on its page on the Hub ({hub.url}), then set HF_TOKEN "
        "to a token of that account"]
    given = forge("model", "fetch", GATED, env=hub_env(tmp_path / "hf", hub.url, HF_TOKEN=TOKEN))
    assert given.returncode == 0 and Path(given.stdout.strip(), "model.safetensors").is_file(), given.stderr
    wrong = forge("model", "fetch", f"{GATED}@main", env=hub_env(tmp_path / "other", hub.url, HF_TOKEN="hf_wrong"))
    assert wrong.returncode == 2 and wrong.stderr.splitlines() == [
        f"Error: {GATED}@main: the Hub ({hub.url}) refused the token in HF_TOKEN (invalid credentials)"]


@pytest.mark.parametrize("case", ["unknown id", "unknown revision", "offline, empty cache", "no Hub, empty cache",
                                  "check: unknown id"])
def test_a_model_that_cannot_be_had_fails_in_one_line(hub, tmp_path, case):
    home, url = tmp_path / "hf", hub.url
    model, command, variables = MODEL, ("model", "fetch"), {}
    if case.endswith("unknown id"):
        model, expected = "org/no-such-model", (f"no such model on the Hub ({url}) (if it is private, set HF_TOKEN "
                                                 "to a token that may read it)")
        command = ("model", "check") if case.startswith("check") else command
    elif case == "unknown revision":
        model, expected = f"{MODEL}@v9", f"the Hub ({url}) has no revision 'v9' of {MODEL}"
    elif case == "offline, empty cache":
        variables = {"HF_HUB_OFFLINE": "1"}
        expected = (f"it is not in the Hugging Face cache ({home / 'hub'}), and HF_HUB_OFFLINE forbids fetching it: "
                    "fetch it where the Hub can be reached, or unset HF_HUB_OFFLINE")
    else:
        url = f"http://127.0.0.1:{free_port()}"                         # nothing listens there
        expected = (f"the Hub ({url}) cannot be reached (ConnectError), and it is not in the Hugging Face cache "
                    f"({home / 'hub'}): check the network or HF_ENDPOINT")
    result = forge(*command, model, env=hub_env(home, url, **variables))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"Error: {model}: {expected}"]


@pytest.mark.parametrize("program", ["forge-learner", "forge-actor", "forge-gateway"])
def test_the_services_read_the_cache_and_never_fetch(hub, tmp_path, program):
    before = len(hub.requests())
    result = forge("--model", MODEL, env=hub_env(tmp_path / "hf", hub.url), program=program)
    assert result.returncode == 2
    assert (f"{MODEL}: not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'}): fetch it first with "
            f"`forge model fetch {MODEL}`") in result.stderr
    assert len(hub.requests()) == before                                # the Hub was not asked


def test_forge_rollout_fetches_the_tokenizers_model_or_says_why_not(hub, tmp_path):
    """forge rollout reads the model's tokenizer: a Hub model not in the cache is fetched, one that cannot be had
    stops it in one line before it plays anything."""
    (tmp_path / "train.jsonl").write_text(json.dumps({"id": "t1", "messages": [{"role": "user", "content": "hi"}]})
                                          + "\n")
    (tmp_path / "verify.py").write_text("def score(task, reply, session):\n    return 1.0\n")
    (tmp_path / "run.toml").write_text('[tasks]\ntrain = "train.jsonl"\nverifier = "verify.py:score"\n'
                                       '[agent]\ncommand = ["python", "-c", "pass"]\n')
    env = hub_env(tmp_path / "hf", hub.url)
    unknown = forge("rollout", "--config", str(tmp_path / "run.toml"), "--gateway", "127.0.0.1:1", "--http",
                    "http://127.0.0.1:1", "--model", "org/no-such-model", "--episodes", "1", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [f"Error: org/no-such-model: no such model on the Hub ({hub.url}) (if it "
                                           "is private, set HF_TOKEN to a token that may read it)"]
    assert cached_model_dir(tmp_path / "hf") == []
    played = forge("rollout", "--config", str(tmp_path / "run.toml"), "--gateway", f"127.0.0.1:{free_port()}",
                   "--http", "http://127.0.0.1:1", "--model", MODEL, "--minutes", "0.01", env=env)
    assert cached_model_dir(tmp_path / "hf") == ["models--org--tiny-random"], played.stderr[-2000:]


def cached_model_dir(home: Path) -> list[str]:
    hub = home / "hub"
    return sorted(p.name for p in hub.glob("models--*")) if hub.exists() else []
