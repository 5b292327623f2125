"""Hugging Face model ids (``org/name``, ``org/name@revision``) as model references, in-process and with no network:
their syntax, read without a lookup; a directory of the same name winning; every setting that names a model
checking an id without a connection (the services' settings look in the cache and name ``forge model fetch``); and
the cache lookup. Fetching through a Hub: tests/integration/app/test_model_fetch.py."""

from __future__ import annotations

import pickle
import socket

import huggingface_hub.constants
import pytest

from forge.actors.config import ActorConfig
from forge.checkpoints import (
    HubError,
    HubId,
    ModelNotFound,
    cached_model,
    hub_id_of,
    parse_hub_id,
    resolve_model,
    trainable_model,
    write_tiny_checkpoint,
)
from forge.gateway.config import GatewayConfig
from forge.learner.config import LearnerConfig
from forge.rollout.config import ModelChoice
from forge.settings import SettingsError


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No connection can be opened, and huggingface_hub's cache (HF_HUB_CACHE, read when it is imported) is an empty
    directory of the test's own."""
    def refuse(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path / "hf" / "hub"


@pytest.mark.parametrize("text, repo, revision", [
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", None),
    ("meta-llama/Llama-3.1-8B-Instruct@main", "meta-llama/Llama-3.1-8B-Instruct", "main"),
    ("org/name@v1.0", "org/name", "v1.0"),
    ("org/name@refs/pr/1", "org/name", "refs/pr/1"),
    ("org_x/name.v2@" + "a" * 40, "org_x/name.v2", "a" * 40),
])
def test_an_id_is_read_from_its_syntax_alone(text, repo, revision):
    hub = parse_hub_id(text)
    assert hub == HubId(repo, revision) and str(hub) == text


@pytest.mark.parametrize("text", ["tiny", "name", "a/b/c", "/abs/path", "./org/name", "~/org/name", "org/", "/name",
                                  "org/name@", "org/name@x..y", "org/name@v1/", "org--x/name", "org/na..me",
                                  "org/-name", "org/name.", "org/na me", "org/name@a b", "o/" + "n" * 96])
def test_anything_else_is_no_id(text):
    assert parse_hub_id(text) is None


def test_resolving_an_id_reads_nothing_and_the_cache_is_read_when_its_files_are_needed(no_network):
    ref = resolve_model("org/name@v1")
    assert ref.hub == HubId("org/name", "v1") and ref.model_id == "org/name@v1" and not ref.builtin
    assert not no_network.exists()                      # not even the cache was looked at
    with pytest.raises(ModelNotFound) as caught:
        ref.directory                                   # noqa: B018
    assert str(caught.value) == (f"org/name@v1: not in the Hugging Face cache ({no_network}): fetch it first with "
                                 "`forge model fetch org/name@v1`")
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)
    for check in (cached_model, trainable_model):
        with pytest.raises(ModelNotFound, match="forge model fetch org/name"):
            check("org/name")


def test_a_directory_of_the_same_name_wins(tmp_path, monkeypatch):
    write_tiny_checkpoint(tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)
    assert hub_id_of("org/name") is None and hub_id_of("org/other") == HubId("org/other")
    ref = resolve_model("org/name")
    assert ref.hub is None and ref.directory == (tmp_path / "org" / "name").resolve()
    assert hub_id_of("tiny") is None and hub_id_of(tmp_path / "org" / "other") is None     # a Path is a path


def test_settings_check_an_id_without_the_network(no_network):
    """The run's [model] (forge up fetches it after its settings are checked) takes an id on its syntax; the
    services, which never fetch, refuse one that is not in the cache, naming the fetch."""
    assert ModelChoice(path="org/name@v1").path == "org/name@v1"
    with pytest.raises(SettingsError, match=r"nor a Hugging Face model id \(org/name or org/name@revision\)"):
        ModelChoice(path="org/na me")
    for build in (LearnerConfig, ActorConfig, GatewayConfig):
        with pytest.raises(SettingsError, match=r"not in the Hugging Face cache .*`forge model fetch org/name`"):
            build(model="org/name")


def test_a_hub_error_says_why_in_one_line_and_pickles():
    error = HubError(HubId("org/name", "v1"), "no such model on the Hub (https://hub.example)")
    assert str(error) == "org/name@v1: no such model on the Hub (https://hub.example)" and "\n" not in str(error)
    assert isinstance(error, ValueError) and str(pickle.loads(pickle.dumps(error))) == str(error)
