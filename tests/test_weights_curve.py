"""The weight channel over CURVE, on real loopback sockets and processes: an authorised subscriber gets versions
bit-exact; a forged publisher, a client key the publisher was not given and a plain subscriber get nothing and say
why; bad key files are refused by the CLIs with one line and exit 2; forge keys weights makes usable key files."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import torch
import zmq
from click.testing import CliRunner

from forge.builtin import tiny_model
from forge.launch import ServiceProcess
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from forge.weights import WeightPublisher, WeightSubscriber
from forge.weights.curve import (
    ClientKeys,
    KeyFileError,
    client_keys,
    create_keys,
    load_client_keys,
    load_key_pair,
    load_public_key,
    server_keys,
)

from conftest import script
from helpers.processes import start_actor

FAST = {"poll_interval_s": 0.1, "request_timeout_s": 0.5}
SAFETY_NET_S = 60.0


def wait_until(predicate, what: str) -> None:
    """Wait for an event; the deadline is only a safety net against a hang."""
    deadline = time.monotonic() + SAFETY_NET_S
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
            "layer.0.fp32": torch.randn(128, 96, generator=g),
            "ids": torch.randint(-10**12, 10**12, (1000,), generator=g),
            "transposed": torch.randn(40, 30, generator=g).t()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.contiguous().view(torch.uint8).numpy()) == \
        bytes(b.contiguous().view(torch.uint8).numpy())


@pytest.fixture
def keys(tmp_path):
    return create_keys(tmp_path / "keys", ["actor-0", "actor-1"])


def publisher_of(keys, **kwargs) -> WeightPublisher:
    return WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=8192,
                           curve=server_keys(keys.server_secret, keys.clients_dir), **kwargs)


def subscriber_of(publisher: WeightPublisher, curve: ClientKeys | None) -> WeightSubscriber:
    return WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, curve=curve, **FAST)


def actor_keys(keys, name: str = "actor-0") -> ClientKeys:
    return client_keys(keys.client_secrets[name], keys.server_public)


def stranger_keys(keys) -> ClientKeys:
    """A key pair the publisher was not given, with the publisher's true public key."""
    public, secret = zmq.curve_keypair()
    return ClientKeys(public, secret, load_public_key(keys.server_public))


def assert_received_nothing(subscriber: WeightSubscriber) -> None:
    stats = subscriber.stats
    assert stats.latest_version is None and stats.bytes_received == 0 and stats.chunks_received == 0, stats


def test_versions_published_over_curve_arrive_bit_exact_at_every_authorised_subscriber(keys):
    with publisher_of(keys) as publisher, subscriber_of(publisher, actor_keys(keys, "actor-0")) as one, \
            subscriber_of(publisher, actor_keys(keys, "actor-1")) as two:
        for version in (1, 2):
            sent = state(version)
            publisher.publish(version, sent)
            for subscriber in (one, two):
                assert subscriber.wait_for_version(version, timeout=SAFETY_NET_S), subscriber.stats
                got = subscriber.latest()[1]
                assert list(got) == list(sent)
                assert all(same_bits(got[name], tensor) for name, tensor in sent.items())
        assert publisher.stats.handshakes_failed == 0 and one.stats.handshakes_failed == 0


@pytest.mark.parametrize("forger", ["other-server-key", "plain"])
def test_a_subscriber_refuses_a_publisher_without_the_learners_key(keys, tmp_path, forger):
    """A forged publisher serving a correctly hashed version: with its own key pair (it admits the actor's public
    key, which is no secret), or with no CURVE at all."""
    if forger == "plain":
        forged = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    else:
        other = create_keys(tmp_path / "forged", ["actor-0"])
        (other.clients_dir / "actor-0.key").write_bytes((keys.clients_dir / "actor-0.key").read_bytes())
        forged = publisher_of(other)
    with forged, subscriber_of(forged, actor_keys(keys)) as subscriber:
        forged.publish(1, state(1))
        wait_until(lambda: subscriber.stats.handshakes_failed >= 1, "the subscriber's handshake failure")
        assert_received_nothing(subscriber)
        assert subscriber.stats.handshake_error
        assert forged.stats.manifests_served == 0 and forged.stats.chunks_served == 0
        assert not subscriber.wait_for_version(1, timeout=0)


def test_a_client_key_the_publisher_was_not_given_is_refused(keys):
    with publisher_of(keys) as publisher, subscriber_of(publisher, stranger_keys(keys)) as stranger, \
            subscriber_of(publisher, actor_keys(keys)) as actor:
        publisher.publish(1, state(1))
        assert actor.wait_for_version(1, timeout=SAFETY_NET_S), actor.stats      # it still serves the actors
        wait_until(lambda: stranger.stats.handshakes_failed >= 1 and publisher.stats.handshakes_failed >= 1,
                   "the refused handshake on both sides")
        assert_received_nothing(stranger)
        assert "ZAP status 400" in stranger.stats.handshake_error
        assert actor.stats.handshakes_failed == 0


def test_a_plain_subscriber_cannot_read_a_curve_publisher(keys):
    with publisher_of(keys) as publisher, subscriber_of(publisher, None) as plain:
        publisher.publish(1, state(1))
        wait_until(lambda: plain.stats.handshakes_failed >= 1, "the plain subscriber's handshake failure")
        assert_received_nothing(plain)
        assert "another security mechanism" in plain.stats.handshake_error
        assert publisher.stats.manifests_served == 0
    with zmq.Context() as context, context.socket(zmq.DEALER) as raw:    # nor can a raw socket ask anything
        raw.setsockopt(zmq.LINGER, 0)
        with publisher_of(keys) as publisher:
            publisher.publish(1, state(1))
            watch = raw.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            raw.connect(publisher.fetch_endpoint)
            raw.send(b"\x0a\x00")              # a manifest request
            assert watch.poll(SAFETY_NET_S * 1000), "no handshake failure reported"
            assert raw.poll(0) == 0 and publisher.stats.manifests_served == 0
            raw.disable_monitor()
            watch.close(linger=0)


# -- key files ---------------------------------------------------------------------------------------------------


def test_create_keys_writes_private_pairs_and_public_certificates(keys):
    assert stat.S_IMODE(keys.server_secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.clients_dir.parent.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys.client_secrets.values())
    assert sorted(p.name for p in keys.clients_dir.iterdir()) == ["actor-0.key", "actor-1.key"]
    pairs = {name: load_key_pair(path) for name, path in keys.client_secrets.items()}
    assert load_client_keys(keys.clients_dir) == {public for public, _ in pairs.values()}
    assert load_public_key(keys.server_public) == load_key_pair(keys.server_secret)[0]
    with pytest.raises(FileExistsError, match="never overwritten"):
        create_keys(keys.clients_dir.parent, ["actor-1"])


def bad_key_files(tmp_path: Path, keys) -> dict[str, tuple[Path, str]]:
    """Broken files by case: (path, what the error says)."""
    text = keys.server_secret.read_text()
    _, secret = load_key_pair(keys.server_secret)
    cases = {"missing": (tmp_path / "none.key_secret", "no such file"),
             "public only": (keys.server_public, "holds no secret-key"),
             "not a certificate": (tmp_path / "junk.key_secret", "has no public-key line"),
             "truncated key": (tmp_path / "short.key_secret", "not a 40-character Z85 CURVE key"),
             "mismatched pair": (tmp_path / "mixed.key_secret", "does not belong to its public-key"),
             "readable by others": (tmp_path / "open.key_secret", "may be read by other users")}
    cases["not a certificate"][0].write_text("hello\n")
    cases["truncated key"][0].write_text(text.replace(secret.decode(), secret.decode()[:30]))
    cases["mismatched pair"][0].write_text(text.replace(secret.decode(), zmq.curve_keypair()[1].decode()))
    cases["readable by others"][0].write_text(text)
    for case in ("not a certificate", "truncated key", "mismatched pair"):
        os.chmod(cases[case][0], 0o600)
    os.chmod(cases["readable by others"][0], 0o644)
    return cases


def test_bad_key_files_get_one_line_errors(tmp_path, keys):
    for case, (path, message) in bad_key_files(tmp_path, keys).items():
        with pytest.raises(KeyFileError, match=message) as raised:
            load_key_pair(path)
        assert "\n" not in str(raised.value), case
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError, match="holds no public certificates"):
        load_client_keys(tmp_path / "empty")
    with pytest.raises(KeyFileError, match="no such directory"):
        load_client_keys(tmp_path / "nowhere")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.key").write_text("public-key = \"short\"\n")
    with pytest.raises(KeyFileError, match="Z85"):
        load_client_keys(tmp_path / "junk")


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
            assert actor.wait_for_version(0, timeout=SAFETY_NET_S), actor.stats
            expected = tiny_model(seed=0).state_dict()
            assert sorted(actor.latest()[1]) == sorted(expected)
            wait_until(lambda: plain.stats.handshakes_failed >= 1, "the plain subscriber's handshake failure")
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
