"""The weight channel over CURVE through the programs: bad key files are refused by forge-learner and forge-actor with
one line and exit 2, ``forge keys weights`` makes usable key files, a forge-learner process serves its weights to
authorised actors only, and a forge-actor process fetches its weights over CURVE. (On sockets in one process:
unit/test_weights_curve.py.)"""

from __future__ import annotations

import subprocess

import grpc
import pytest
from click.testing import CliRunner

from forge.checkpoints import tiny_model
from forge.launch import ServiceProcess
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from forge.weights import WeightSubscriber
from forge.weights.curve import (
    client_keys,
    create_keys,
    load_client_keys,
)

from conftest import script
from helpers.processes import start_actor
from helpers.waiting import WAIT_S, wait_for
from helpers.weights import FAST, actor_keys, assert_received_nothing, bad_key_files, publisher_of


@pytest.fixture
def keys(tmp_path):
    return create_keys(tmp_path / "keys", ["actor-0", "actor-1"])


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


def one_error_line(returncode: int, stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert returncode == 2 and len(errors) == 1, stderr
    return errors[0]


def refusal(command, *args: str) -> str:
    """The error line of ``command`` (the click command, run here) given ``args``."""
    result = CliRunner().invoke(command, list(args))
    return one_error_line(result.exit_code, result.output)


def test_the_learner_and_the_actor_refuse_bad_key_files_with_exit_2(tmp_path, keys):
    from forge.actors.cli import actor
    from forge.learner.cli import learner

    at_learner = ["--pool", str(tmp_path / "pool"), "--create-pool", "--run-dir", str(tmp_path / "run")]
    at_actor = ["--weights-fetch", "tcp://127.0.0.1:5701", "--weights-announce", "tcp://127.0.0.1:5702"]
    cases = bad_key_files(tmp_path, keys)
    for case, (path, message) in cases.items():
        line = refusal(learner, *at_learner, "--weights-key", str(path), "--weights-clients", str(keys.clients_dir))
        assert "--weights-key" in line and message in line, (case, line)
        line = refusal(actor, *at_actor, "--weights-key", str(path), "--weights-server-key", str(keys.server_public))
        assert "--weights-key" in line and message in line, (case, line)
    (tmp_path / "empty").mkdir()
    line = refusal(learner, *at_learner, "--weights-key", str(keys.server_secret), "--weights-clients",
                   str(tmp_path / "empty"))
    assert "--weights-clients" in line and "holds no public certificates" in line
    line = refusal(actor, *at_actor, "--weights-key", str(keys.client_secrets["actor-0"]), "--weights-server-key",
                   str(cases["not a certificate"][0]))
    assert "--weights-server-key" in line and "has no public-key line" in line
    assert "go together" in refusal(learner, *at_learner, "--weights-key", str(keys.server_secret))
    assert "go together" in refusal(actor, *at_actor, "--weights-key", str(keys.client_secrets["actor-0"]))
    path, message = cases["mismatched pair"]                      # and so do the installed commands
    result = run(script("forge-learner"), *at_learner, "--weights-key", str(path), "--weights-clients",
                 str(keys.clients_dir))
    assert message in one_error_line(result.returncode, result.stderr)
    result = run(script("forge-actor"), *at_actor, "--weights-key", str(path), "--weights-server-key",
                 str(keys.server_public))
    assert message in one_error_line(result.returncode, result.stderr)
    assert not (tmp_path / "run").exists()                         # refused before anything was set up


def test_forge_keys_weights_makes_keys_and_never_overwrites(tmp_path):
    made = run(script("forge"), "keys", "weights", str(tmp_path / "k"), "--actors", "3")
    assert made.returncode == 0, made.stderr
    assert "--weights-key" in made.stdout and "actor-2" in made.stdout
    assert len(load_client_keys(tmp_path / "k" / "clients")) == 3
    client_keys(tmp_path / "k" / "actor-2.key_secret", tmp_path / "k" / "learner.key")
    again = run(script("forge"), "keys", "weights", str(tmp_path / "k"))
    assert "never overwritten" in one_error_line(again.returncode, again.stderr)


# -- the services ------------------------------------------------------------------------------------------------


def test_a_forge_learner_process_serves_its_weights_to_authorised_actors_only(tmp_path, keys):
    learner = ServiceProcess("learner", "forge-learner", [
        "--pool", str(tmp_path / "pool"), "--create-pool", "--run-dir", str(tmp_path / "run"), "--port", "0",
        "--weights-fetch", "tcp://127.0.0.1:*", "--weights-announce", "tcp://127.0.0.1:*",
        "--weights-key", str(keys.server_secret), "--weights-clients", str(keys.clients_dir)], tmp_path,
        timeout_s=180)
    try:
        fetch, announce = learner.info["weights_fetch"], learner.info["weights_announce"]
        with WeightSubscriber(fetch, announce, curve=actor_keys(keys), **FAST) as actor, \
                WeightSubscriber(fetch, announce, **FAST) as plain:
            assert actor.wait_for_version(0, timeout=WAIT_S), actor.stats
            expected = tiny_model(seed=0).state_dict()
            assert sorted(actor.latest()[1]) == sorted(expected)
            wait_for(lambda: plain.stats.handshakes_failed >= 1, "the plain subscriber's handshake failure")
            assert_received_nothing(plain)
    finally:
        assert learner.stop() == 0


def test_a_forge_actor_process_fetches_its_weights_over_curve(tmp_path, keys):
    with publisher_of(keys) as publisher:
        first = tiny_model(seed=3)
        publisher.publish(4, first.state_dict())
        actor = start_actor(tmp_path, "--weights-fetch", publisher.fetch_endpoint, "--weights-announce",
                            publisher.announce_endpoint, "--weights-key", str(keys.client_secrets["actor-1"]),
                            "--weights-server-key", str(keys.server_public))
        try:
            with grpc.insecure_channel(actor.address) as channel:
                stats = actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest())
                assert stats.gauges["weight_version"] == 4
                request = actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3], sampling=common_pb2.SamplingParams(
                    temperature=0, max_tokens=4, ignore_eos=True))
                chunks = list(actor_pb2_grpc.ActorStub(channel).Generate(request))
                assert {v for c in chunks for v in c.weight_versions} == {4}
            assert publisher.stats.handshakes_failed == 0 and publisher.stats.chunks_served > 0
        finally:
            assert actor.stop() == 0
