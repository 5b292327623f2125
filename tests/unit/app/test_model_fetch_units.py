"""The entry points' fetch of a Hugging Face model, in-process and with no network: which models forge up fetches,
what ``forge model fetch`` takes, a built-in model or a directory printed as it is, and a model that cannot be had
refused with exit status 2. (Through a Hub: integration/app/test_model_fetch.py.)"""

from __future__ import annotations

import socket

import huggingface_hub.constants
import pytest
from click.testing import CliRunner

from forge.app.model_fetch import FetchConfig, FetchFailed, fetch_command, fetch_model
from forge.app.up.config import UpConfig
from forge.checkpoints import TINY_DIR, write_tiny_checkpoint
from forge.rollout.config import ModelChoice
from forge.settings import SettingsError


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """huggingface_hub offline (HF_HUB_OFFLINE, read when it is imported) over an empty cache, and no connection."""
    def refuse(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_forge_up_fetches_the_runs_hub_model_only():
    assert UpConfig(model=ModelChoice(path="org/name@v1")).hub_models() == ("org/name@v1",)
    assert UpConfig().hub_models() == () and UpConfig(model=ModelChoice(path="tiny-moe")).hub_models() == ()


def test_fetch_takes_any_model_reference_on_its_syntax():
    assert FetchConfig(model="org/name@main").model == "org/name@main"
    with pytest.raises(SettingsError, match="nor a Hugging Face model id"):
        FetchConfig(model="org/name@")


def test_a_local_model_is_printed_as_it_is(tmp_path, offline):
    directory = write_tiny_checkpoint(tmp_path / "ckpt")
    assert fetch_model("tiny") == TINY_DIR and fetch_model(str(directory)) == directory.resolve()
    result = CliRunner().invoke(fetch_command, [str(directory)])
    assert result.exit_code == 0 and result.output == f"{directory.resolve()}\n"


def test_a_model_that_cannot_be_had_is_exit_status_2_in_one_line(offline):
    with pytest.raises(FetchFailed) as caught:
        fetch_model("org/name")
    assert caught.value.exit_code == 2
    result = CliRunner().invoke(fetch_command, ["org/name"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"Error: org/name: it is not in the Hugging Face cache ({offline}), and HF_HUB_OFFLINE forbids fetching it: "
        "fetch it where the Hub can be reached, or unset HF_HUB_OFFLINE"]
