"""Weight fan-out on loopback: how long one version takes to reach ALL of N subscribers (simulated actors), every one
fetching from the learner's publisher (star) against a relay tree (``--fanout`` children per server, the relays
being subscribers that re-serve what they verified, ``forge.weights.relay``).

Usage: ``.venv/bin/python bench/weights_fanout.py [--subscribers 1 4 16 64] [--fanout 4] [--size-mb 32]
[--chunk-mb 1] [--repeats 3] [--link-gbps 1] [--workers 2]``

The publisher runs in a process of its own; the subscribers run as threads of ``--workers`` processes (node i in
worker i mod W, so a relay and its children are mostly in different processes). A round publishes a new version
(same bytes, new number) and ends when the last subscriber's ``on_version`` has run; its time is taken from the
publisher's ``publish()`` call (one clock: CLOCK_MONOTONIC is system-wide). Figures are medians over the repeats,
after two untimed, unshaped rounds (connections, and the first touch of each subscriber's two receive buffers).

Two link models, both printed:

- **unshaped**: raw loopback. On a small machine this is CPU-bound: every byte is copied, received and hashed on
  the same few cores whatever the topology, so a tree cannot beat the star by much (its relays add hops).
- **shaped**: each server's egress (the publisher's and every relay's) is paced to ``--link-gbps`` per server, by
  pausing ``chunk_size / rate`` before each chunk it serves (``Faults.chunk_delay_s``, which the serving thread
  honours). The learner's link is then the star's bottleneck, as a real NIC would be: star ≈ N·size/rate, the
  tree ≈ depth·fanout·size/rate (each relay forwards a version once it has verified all of it). The rate is scaled
  down so that the links, not this machine's cores, are what is measured; where the tree's figure still exceeds
  its link bound, the cores were the limit (the ``link bound`` columns).

Also printed: the learner's egress per version (what the relays save it).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch
from weights_transfer import make_state

from forge.weights import Faults, WeightPublisher, WeightRelay, WeightSubscriber

MB = 1 << 20


class Pacing(Faults):
    """A server's pause before each chunk it serves (``Faults.chunk_delay_s``), changeable between rounds."""

    def pace(self, delay_s: float) -> None:
        object.__setattr__(self, "chunk_delay_s", delay_s)

WARMUP = 2     # untimed rounds: connections, and each subscriber's two receive buffers (first touch is slow)
SUBSCRIBER_OPTIONS = {"request_timeout_s": 120.0}   # a shaped star keeps a subscriber waiting; never reconnect


# -- the publisher's process ---------------------------------------------------------------------------------------


def publisher_main(conn: Connection, size: int, chunk_size: int) -> None:
    """Commands: ("start",) -> endpoints (a fresh publisher, unpaced); ("pace", chunk_delay_s); ("publish",
    version) -> (monotonic start, bytes served before it); ("bytes",) -> bytes served so far; ("stop",)."""
    logging.basicConfig(level=logging.WARNING)
    state = make_state(size, 8)
    publisher: WeightPublisher | None = None
    pacing = Pacing()
    while True:
        command, *args = conn.recv()
        if command == "start":
            if publisher is not None:
                publisher.close()
            pacing.pace(0.0)
            publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", chunk_size=chunk_size,
                                        faults=pacing)
            conn.send((publisher.fetch_endpoint, publisher.announce_endpoint))
        elif command == "pace":
            pacing.pace(args[0])
            conn.send(None)
        elif command == "publish":
            served = publisher.stats.bytes_served
            started = time.monotonic()
            publisher.publish(args[0], state)
            conn.send((started, served))
        elif command == "bytes":
            conn.send(publisher.stats.bytes_served)
        else:
            if publisher is not None:
                publisher.close()
            conn.send(None)
            return


# -- the subscribers' processes ------------------------------------------------------------------------------------


class Node:
    """One simulated actor: a subscriber, and a relay of what it verifies when it has children."""

    def __init__(self, fetch: str, announce: str, relay: bool, window: int, applied: dict[int, float]) -> None:
        self.relay = None
        self.pacing = Pacing()
        if relay:
            self.relay = WeightRelay("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", faults=self.pacing)

        def record(version: int, tensors: dict[str, torch.Tensor]) -> None:
            applied[version] = time.monotonic()

        self.applied = applied
        self.subscriber = WeightSubscriber(fetch, announce, record, window=window,
                                           on_verified=self.relay.serve if self.relay else None,
                                           **SUBSCRIBER_OPTIONS)

    def close(self) -> None:
        self.subscriber.close()
        if self.relay is not None:
            self.relay.close()


def worker_main(conn: Connection, window: int) -> None:
    """Commands: ("create", [(node, fetch, announce, relays)]) -> {node: (fetch, announce)} of the relays made;
    ("pace", chunk_delay_s) of every relay; ("wait", version, timeout) -> the latest on_version time of this
    worker's nodes (None on timeout); ("reset",) -> (rejected, reconnects) of the nodes closed; ("stop",)."""
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    nodes: dict[int, Node] = {}
    while True:
        command, *args = conn.recv()
        if command == "create":
            made = {}
            for node, fetch, announce, relays in args[0]:
                nodes[node] = Node(fetch, announce, relays, window, {})
                relay = nodes[node].relay
                if relay is not None:
                    made[node] = (relay.fetch_endpoint, relay.announce_endpoint)
            conn.send(made)
        elif command == "pace":
            for node in nodes.values():
                node.pacing.pace(args[0])
            conn.send(None)
        elif command == "wait":
            version, timeout = args
            deadline = time.monotonic() + timeout
            if all(n.subscriber.wait_for_version(version, max(0.0, deadline - time.monotonic()))
                   for n in nodes.values()):
                conn.send(max(n.applied[version] for n in nodes.values()))
            else:
                conn.send(None)
        elif command == "reset":
            figures = [n.subscriber.stats for n in nodes.values()]
            for node in nodes.values():
                node.close()
            nodes.clear()
            conn.send((sum(f.versions_rejected for f in figures), sum(f.reconnects for f in figures)))
        else:
            for node in nodes.values():
                node.close()
            conn.send(None)
            return


class Process:
    """A child process spoken to over a pipe, one command at a time."""

    def __init__(self, target, *args: object) -> None:
        self.conn, child = mp.Pipe()
        self.process = mp.get_context("spawn").Process(target=target, args=(child, *args), daemon=True)
        self.process.start()

    def send(self, *command: object) -> None:
        self.conn.send(command)

    def ask(self, *command: object):
        self.send(*command)
        return self.conn.recv()

    def stop(self) -> None:
        self.ask("stop")
        self.process.join(30)


# -- a topology ----------------------------------------------------------------------------------------------------


def parents(count: int, fanout: int | None) -> list[int | None]:
    """Each node's parent (None: the publisher): a star without ``fanout``, else a tree in breadth-first order
    where the publisher and every relay serve ``fanout`` children."""
    if fanout is None:
        return [None] * count
    return [None if i < fanout else (i - fanout) // fanout for i in range(count)]


def depth(count: int, fanout: int | None) -> int:
    up = parents(count, fanout)
    levels = [0] * count
    for i, parent in enumerate(up):
        levels[i] = 1 if parent is None else levels[parent] + 1
    return max(levels)


@dataclass
class Result:
    seconds: float          # median time for a version to reach every subscriber
    egress: float           # bytes the learner served per version


def build(count: int, fanout: int | None, publisher: Process, workers: list[Process]) -> list[int]:
    """Start a publisher and the ``count`` nodes of the topology, level by level (a relay's endpoints exist once it
    is made), all unpaced; returns the workers used."""
    fetch, announce = publisher.ask("start")
    up = parents(count, fanout)
    has_children = {p for p in up if p is not None}
    served: dict[int | None, tuple[str, str]] = {None: (fetch, announce)}
    pending = list(range(count))
    while pending:
        ready = [i for i in pending if up[i] in served]
        by_worker: dict[int, list] = {}
        for i in ready:
            by_worker.setdefault(i % len(workers), []).append((i, *served[up[i]], i in has_children))
        for w, specs in by_worker.items():
            workers[w].send("create", specs)
        for w in by_worker:
            served.update(workers[w].conn.recv())
        pending = [i for i in pending if i not in ready]
    return sorted({i % len(workers) for i in range(count)})


def run(count: int, fanout: int | None, delay_s: float, publisher: Process, workers: list[Process],
        args: argparse.Namespace, version: int) -> tuple[Result, int]:
    """Time ``args.repeats`` versions (after the unpaced warm-up; then every server pauses ``delay_s`` before each
    chunk) on a fresh topology, then tear it down; returns the result and the next version number."""
    used = build(count, fanout, publisher, workers)
    times, first_bytes = [], 0
    for repeat in range(WARMUP + args.repeats):
        if repeat == WARMUP and delay_s:
            publisher.ask("pace", delay_s)
            for w in used:
                workers[w].ask("pace", delay_s)
        started, served_before = publisher.ask("publish", version)
        if repeat == WARMUP:
            first_bytes = served_before
        for w in used:
            workers[w].send("wait", version, args.timeout)
        finished = [workers[w].conn.recv() for w in used]
        if any(f is None for f in finished):
            raise SystemExit(f"version {version} did not reach all {count} subscribers within {args.timeout} s")
        if repeat >= WARMUP:
            times.append(max(finished) - started)
        version += 1
    egress = (publisher.ask("bytes") - first_bytes) / args.repeats
    rejected = reconnects = 0
    for w in used:
        r, c = workers[w].ask("reset")
        rejected, reconnects = rejected + r, reconnects + c
    if rejected or reconnects:
        raise SystemExit(f"{rejected} versions rejected, {reconnects} reconnects: the figures would not be clean")
    return Result(statistics.median(times), egress), version


def link_bound(count: int, fanout: int | None, size: int, rate: float) -> float:
    """Seconds the shaped links alone need: the busiest server sends its children the version, once per level."""
    if fanout is None or count <= fanout:
        return count * size / rate
    return depth(count, fanout) * fanout * size / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--fanout", type=int, default=4, help="children per server in the relay tree")
    parser.add_argument("--size-mb", type=int, default=32, help="bytes per version, in MiB")
    parser.add_argument("--chunk-mb", type=float, default=1.0)
    parser.add_argument("--window", type=int, default=8, help="chunks in flight per subscriber")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--link-gbps", type=float, default=1.0,
                        help="shaped model: egress of each server, Gbit/s (0: unshaped only)")
    parser.add_argument("--workers", type=int, default=2, help="processes holding the subscribers")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a round may take before failing")
    args = parser.parse_args()
    if args.fanout < 1 or min(args.subscribers) < 1 or args.repeats < 1 or args.workers < 1:
        parser.error("--fanout, --subscribers, --repeats and --workers must be positive")
    logging.basicConfig(level=logging.WARNING)
    size, chunk = args.size_mb * MB, int(args.chunk_mb * MB)
    rate = args.link_gbps * 1e9 / 8
    models = [("unshaped", 0.0)] + ([(f"shaped, {args.link_gbps:g} Gbit/s per server", chunk / rate)]
                                    if args.link_gbps > 0 else [])
    print(f"{args.size_mb} MiB versions, {chunk / MB:g} MiB chunks, window {args.window}, relay fan-out "
          f"{args.fanout}, {args.workers} subscriber processes, {args.repeats} repeats (median), "
          f"{mp.cpu_count()} CPUs; seconds until every subscriber has applied the version")
    publisher = Process(publisher_main, size, chunk)
    workers = [Process(worker_main, args.window) for _ in range(args.workers)]
    version = 1
    try:
        for name, delay in models:
            print(f"\n{name}")
            shaped = delay > 0
            print(f"{'subscribers':>11} {'depth':>5} {'star s':>8} {'relay s':>8} {'relay/star':>11}"
                  f" {'learner MB/version star':>24} {'relay':>6}"
                  + (f" {'link bound star s':>18} {'relay':>6}" if shaped else ""))
            for count in args.subscribers:
                star, version = run(count, None, delay, publisher, workers, args, version)
                tree, version = run(count, args.fanout, delay, publisher, workers, args, version)
                line = (f"{count:>11} {depth(count, args.fanout):>5} {star.seconds:8.2f} {tree.seconds:8.2f} "
                        f"{tree.seconds / star.seconds:11.2f} {star.egress / 1e6:24.0f} {tree.egress / 1e6:6.0f}")
                if shaped:
                    line += (f" {link_bound(count, None, size, rate):18.2f}"
                             f" {link_bound(count, args.fanout, size, rate):6.2f}")
                print(line, flush=True)
    finally:
        for worker in workers:
            worker.stop()
        publisher.stop()


if __name__ == "__main__":
    main()
