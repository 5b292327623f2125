"""The weight channel in tests: subscriber options for quick retries, free loopback endpoints, a mixed state (every
dtype and layout a state dict may hold), a record of the versions a subscriber applied, bit-exact comparison; and for CURVE, publishers and actors' keys
made from ``forge.weights.curve.create_keys``, and broken key files."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import zmq

from forge.weights import WeightPublisher, WeightSubscriber
from forge.weights.curve import ClientKeys, client_keys, load_key_pair, server_keys

from conftest import free_port

FAST = {"poll_interval_s": 0.1, "request_timeout_s": 0.5}
STEADY = {"poll_interval_s": 0.1, "request_timeout_s": 30.0}    # no reconnects (and refetches) in healthy trees


def endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) == \
        bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_state_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert same_bits(got[name], tensor.detach().cpu()), name


def mixed_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(40, 30, generator=g)
    bf16 = torch.randn(33, 17, generator=g).to(torch.bfloat16)
    bf16[0, 0] = float("nan")
    return {
        "embed.weight": bf16,
        "layer.0.fp32": base,
        "layer.0.fp16": torch.randn(5, 3, 2, generator=g).to(torch.float16),
        "step": torch.tensor(seed, dtype=torch.int64),                  # 0-d
        "ids": torch.randint(-10**12, 10**12, (1000,), generator=g),  # int64
        "mask": torch.rand(7, generator=g) > 0.5,
        "transposed": base.t(),                                          # non-contiguous
        "strided": base[::3, 5:9],                                       # non-contiguous, storage offset
        "empty": torch.empty(0, 4),
        "param": torch.nn.Parameter(torch.randn(9, generator=g)),       # requires grad
    }


class Received:
    """An on_version callback that records every version it is given."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def __call__(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        self.versions.append(version)
        self.states[version] = tensors


def publisher_of(keys, **kwargs) -> WeightPublisher:
    return WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=8192,
                           curve=server_keys(keys.server_secret, keys.clients_dir), **kwargs)


def actor_keys(keys, name: str = "actor-0") -> ClientKeys:
    return client_keys(keys.client_secrets[name], keys.server_public)


def assert_received_nothing(subscriber: WeightSubscriber) -> None:
    stats = subscriber.stats
    assert stats.latest_version is None and stats.bytes_received == 0 and stats.chunks_received == 0, stats


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
