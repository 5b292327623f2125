"""The weight channel over CURVE, on real loopback sockets: an authorised subscriber gets versions bit-exact; a
forged publisher, a client key the publisher was not given and a plain subscriber get nothing and say why; bad key
files are refused with one line. (The programs and their processes: integration/test_weights_curve.py.)"""

from __future__ import annotations

import stat

import pytest
import torch
import zmq

from forge.weights import WeightPublisher, WeightSubscriber
from forge.weights.curve import (
    ClientKeys,
    KeyFileError,
    create_keys,
    load_client_keys,
    load_key_pair,
    load_public_key,
)

from helpers.waiting import WAIT_S, wait_for
from helpers.weights import FAST, actor_keys, assert_received_nothing, bad_key_files, publisher_of, same_bits


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
            "layer.0.fp32": torch.randn(128, 96, generator=g),
            "ids": torch.randint(-10**12, 10**12, (1000,), generator=g),
            "transposed": torch.randn(40, 30, generator=g).t()}


@pytest.fixture
def keys(tmp_path):
    return create_keys(tmp_path / "keys", ["actor-0", "actor-1"])


def subscriber_of(publisher: WeightPublisher, curve: ClientKeys | None) -> WeightSubscriber:
    return WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, curve=curve, **FAST)


def stranger_keys(keys) -> ClientKeys:
    """A key pair the publisher was not given, with the publisher's true public key."""
    public, secret = zmq.curve_keypair()
    return ClientKeys(public, secret, load_public_key(keys.server_public))


def test_versions_published_over_curve_arrive_bit_exact_at_every_authorised_subscriber(keys):
    with publisher_of(keys) as publisher, subscriber_of(publisher, actor_keys(keys, "actor-0")) as one, \
            subscriber_of(publisher, actor_keys(keys, "actor-1")) as two:
        for version in (1, 2):
            sent = state(version)
            publisher.publish(version, sent)
            for subscriber in (one, two):
                assert subscriber.wait_for_version(version, timeout=WAIT_S), subscriber.stats
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
        wait_for(lambda: subscriber.stats.handshakes_failed >= 1, "the subscriber's handshake failure")
        assert_received_nothing(subscriber)
        assert subscriber.stats.handshake_error
        assert forged.stats.manifests_served == 0 and forged.stats.chunks_served == 0
        assert not subscriber.wait_for_version(1, timeout=0)


def test_a_client_key_the_publisher_was_not_given_is_refused(keys):
    with publisher_of(keys) as publisher, subscriber_of(publisher, stranger_keys(keys)) as stranger, \
            subscriber_of(publisher, actor_keys(keys)) as actor:
        publisher.publish(1, state(1))
        assert actor.wait_for_version(1, timeout=WAIT_S), actor.stats      # it still serves the actors
        wait_for(lambda: stranger.stats.handshakes_failed >= 1 and publisher.stats.handshakes_failed >= 1,
                   "the refused handshake on both sides")
        assert_received_nothing(stranger)
        assert "ZAP status 400" in stranger.stats.handshake_error
        assert actor.stats.handshakes_failed == 0


def test_a_plain_subscriber_cannot_read_a_curve_publisher(keys):
    with publisher_of(keys) as publisher, subscriber_of(publisher, None) as plain:
        publisher.publish(1, state(1))
        wait_for(lambda: plain.stats.handshakes_failed >= 1, "the plain subscriber's handshake failure")
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
            assert watch.poll(WAIT_S * 1000), "no handshake failure reported"
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
