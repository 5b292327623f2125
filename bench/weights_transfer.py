"""Weight transport throughput on loopback: WeightPublisher -> WeightSubscriber, plain and over CURVE, against a raw
ZeroMQ send of the same number of bytes (same chunk size and window, no hashing, no manifest), the sender in its
own process.

Usage: ``.venv/bin/python bench/weights_transfer.py [--size-mb 256 1024] [--repeats 5] [--chunk-mb 4] [--window 8]``

Figures, each the median over the repeats:
  raw        PUSH -> PULL of the bytes into one preallocated buffer (the subscriber recycles its buffers too)
  transfer   ours, manifest accepted -> every chunk received and verified (what each subscriber pays)
  end-to-end ours, publish() called -> on_version called (adds staging and hashing on the publisher, paid once
             per version whatever the number of subscribers)
  curve      ours over CURVE (encrypted and authenticated, keys made for the run), transfer and end-to-end, and
             its transfer as a share of the plain one's
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch
import zmq

from forge.weights import ALGORITHMS, DEFAULT_ALGORITHM, WeightPublisher, WeightSubscriber
from forge.weights.curve import KeySet, client_keys, create_keys, server_keys
from forge.weights.hashing import hash_parts

MB = 1 << 20
WARMUP = 2   # untimed rounds: connections, and the subscriber's two buffers (first touch of fresh memory is slow)


def make_state(size: int, tensor_mb: int) -> dict[str, torch.Tensor]:
    """bf16 tensors of ``tensor_mb`` (plus a remainder) adding up to ``size`` bytes."""
    generator = torch.Generator().manual_seed(0)
    state, left, index = {}, size, 0
    while left:
        nbytes = min(left, tensor_mb * MB)
        state[f"layers.{index}.weight"] = torch.randn(nbytes // 2, generator=generator).to(torch.bfloat16)
        left -= nbytes
        index += 1
    return state


def ours_sender(conn: Connection, size: int, args: argparse.Namespace, keys: KeySet | None = None) -> None:
    """Publishes ``size`` bytes as a new version on each command (over CURVE with ``keys``); answers (publish
    seconds, CPU seconds so far)."""
    state = make_state(size, args.tensor_mb)
    curve = server_keys(keys.server_secret, keys.clients_dir) if keys else None
    with WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=args.chunk_mb * MB,
                         hash_algorithm=args.hash, curve=curve) as publisher:
        conn.send((publisher.fetch_endpoint, publisher.announce_endpoint))
        while (version := conn.recv()) is not None:
            cpu, started = time.process_time(), time.perf_counter()
            publisher.publish(version, state)
            conn.send((time.perf_counter() - started, cpu))
    conn.send(time.process_time())


def raw_sender(conn: Connection, size: int, args: argparse.Namespace) -> None:
    """Pushes ``size`` bytes in chunks on each command; answers the CPU seconds so far."""
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    chunk = args.chunk_mb * MB
    with zmq.Context() as context, context.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.SNDHWM, args.window)
        push.bind("tcp://127.0.0.1:*")
        conn.send(push.getsockopt_string(zmq.LAST_ENDPOINT))
        while conn.recv() is not None:
            conn.send(time.process_time())
            for offset in range(0, size, chunk):
                push.send(data[offset:offset + chunk], copy=False)
    conn.send(time.process_time())


class Side:
    """A sender in a child process and the receiving end here; tracks the CPU time of both, timed rounds only."""

    def __init__(self, target, size: int, args: argparse.Namespace, *extra: object) -> None:
        self.size = size
        self.conn, child_conn = mp.Pipe()
        self.child = mp.get_context("spawn").Process(target=target, args=(child_conn, size, args, *extra),
                                                     daemon=True)
        self.child.start()
        self.own_cpu = 0.0
        self.child_cpu_marks: list[float] = []

    def cpu_per_gb(self, rounds: int) -> float:
        child_cpu = self.child_cpu_marks[-1] - self.child_cpu_marks[WARMUP]   # from the first timed round's start
        return (self.own_cpu + child_cpu) / (self.size * rounds / 1e9)

    def stop_child(self) -> None:
        self.conn.send(None)
        self.child_cpu_marks.append(self.conn.recv())
        self.child.join()


class RawReceiver(Side):
    """PUSH (child process) -> PULL (here) of ``size`` bytes per round into one preallocated buffer."""

    def __init__(self, size: int, args: argparse.Namespace) -> None:
        super().__init__(raw_sender, size, args)
        self.chunk = args.chunk_mb * MB
        self.context = zmq.Context()
        self.pull = self.context.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, args.window)
        self.pull.connect(self.conn.recv())
        self.buffer = np.empty(size, dtype=np.uint8)

    def round(self, index: int) -> float:
        cpu, started = time.process_time(), time.perf_counter()
        self.conn.send(index)
        for offset in range(0, self.size, self.chunk):
            self.pull.recv_into(memoryview(self.buffer[offset:offset + self.chunk]))
        elapsed = time.perf_counter() - started
        self.child_cpu_marks.append(self.conn.recv())
        if index >= WARMUP:
            self.own_cpu += time.process_time() - cpu
        return self.size / elapsed / 1e9

    def close(self) -> None:
        self.stop_child()
        self.pull.close()
        self.context.term()


class OursReceiver(Side):
    """WeightPublisher (child process) -> WeightSubscriber (here), one version per round; over CURVE with ``keys``."""

    def __init__(self, size: int, args: argparse.Namespace, keys: KeySet | None = None) -> None:
        super().__init__(ours_sender, size, args, keys)
        fetch, announce = self.conn.recv()
        self.applied = threading.Event()
        curve = client_keys(keys.client_secrets["bench"], keys.server_public) if keys else None
        self.sub = WeightSubscriber(fetch, announce, lambda version, tensors: self.applied.set(), window=args.window,
                                    curve=curve)

    def round(self, version: int) -> tuple[float, float, float]:
        """(end-to-end, transfer, publish) GB/s."""
        self.applied.clear()
        cpu, started = time.process_time(), time.perf_counter()
        self.conn.send(version)
        if not self.applied.wait(120):
            raise SystemExit(f"version {version} did not arrive: {self.sub.stats}")
        elapsed = time.perf_counter() - started
        if version >= WARMUP:
            self.own_cpu += time.process_time() - cpu
        publish_s, child_cpu = self.conn.recv()
        self.child_cpu_marks.append(child_cpu)
        return self.size / elapsed / 1e9, self.sub.stats.last_transfer_gbps, self.size / publish_s / 1e9

    def close(self) -> None:
        stats = self.sub.stats
        self.sub.close()
        self.stop_child()
        if stats.versions_rejected or stats.handshakes_failed:
            raise SystemExit(f"unexpected subscriber figures: {stats}")


def hash_rates(chunk: int, rounds: int = 32) -> dict[str, float]:
    """Single-thread GB/s of every chunk hash algorithm over ``chunk``-sized buffers."""
    data = np.random.default_rng(1).integers(0, 256, chunk, dtype=np.uint8)
    rates = {}
    for algorithm in ALGORITHMS:
        started = time.perf_counter()
        for _ in range(rounds):
            hash_parts(algorithm, (data,))
        rates[algorithm] = chunk * rounds / (time.perf_counter() - started) / 1e9
    return rates


def measure(size: int, args: argparse.Namespace, keys: KeySet) -> dict[str, float]:
    """Median GB/s of raw, transfer, end-to-end and publish (plain and CURVE), and CPU seconds per GB of each
    (both processes); the three alternate round by round so that all see the same machine load."""
    raw, ours, curve = RawReceiver(size, args), OursReceiver(size, args), OursReceiver(size, args, keys)
    raw_rates, our_rates, curve_rates = [], [], []
    try:
        for repeat in range(WARMUP + args.repeats):
            rates = raw.round(repeat), ours.round(repeat), curve.round(repeat)
            if repeat >= WARMUP:
                for column, rate in zip((raw_rates, our_rates, curve_rates), rates, strict=True):
                    column.append(rate)
    finally:
        raw.close()
        ours.close()
        curve.close()
    end_to_end, transfer, publish = (statistics.median(column) for column in zip(*our_rates, strict=True))
    curve_e2e, curve_transfer, _ = (statistics.median(column) for column in zip(*curve_rates, strict=True))
    return {"raw": statistics.median(raw_rates), "transfer": transfer, "e2e": end_to_end, "publish": publish,
            "curve_transfer": curve_transfer, "curve_e2e": curve_e2e, "raw_cpu": raw.cpu_per_gb(args.repeats),
            "our_cpu": ours.cpu_per_gb(args.repeats), "curve_cpu": curve.cpu_per_gb(args.repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, nargs="+", default=[256], help="bytes per version, in MiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mb", type=int, default=4)
    parser.add_argument("--window", type=int, default=8, help="chunks in flight")
    parser.add_argument("--tensor-mb", type=int, default=64, help="size of each bf16 tensor")
    parser.add_argument("--hash", choices=ALGORITHMS, default=DEFAULT_ALGORITHM, help="chunk hash")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"chunk {args.chunk_mb} MiB, window {args.window}, hash {args.hash}, {args.repeats} repeats, "
          f"{torch.get_num_threads()} CPU threads; median GB/s (1 GB = 1e9 bytes)")
    rates = hash_rates(args.chunk_mb * MB)
    print("chunk hash, one thread: " + ", ".join(f"{name} {rate:.2f}" for name, rate in rates.items()))
    print(f"{'size':>9} {'raw':>6} {'transfer':>9} {'e2e':>6} {'publish':>8} {'transfer/raw':>13} {'e2e/raw':>8}"
          f" {'curve transfer':>15} {'curve e2e':>10} {'curve/plain':>12} {'CPU s/GB raw':>13} {'ours':>5}"
          f" {'curve':>6}")
    with tempfile.TemporaryDirectory(prefix="forge-bench-keys-") as directory:
        keys = create_keys(Path(directory) / "keys", ["bench"])
        for size_mb in args.size_mb:
            m = measure(size_mb * MB, args, keys)
            print(f"{size_mb:>5} MiB {m['raw']:6.2f} {m['transfer']:9.2f} {m['e2e']:6.2f} {m['publish']:8.2f} "
                  f"{m['transfer'] / m['raw']:12.0%} {m['e2e'] / m['raw']:8.0%} {m['curve_transfer']:15.2f} "
                  f"{m['curve_e2e']:10.2f} {m['curve_transfer'] / m['transfer']:11.0%} {m['raw_cpu']:13.2f} "
                  f"{m['our_cpu']:5.2f} {m['curve_cpu']:6.2f}")


if __name__ == "__main__":
    main()
