"""The middleware over time: --sessions session slots, each running multi-turn sessions of --calls calls one after
another and ending each (as an agent's driver does), for --minutes against one gateway, its pool and an actor on the
load-test backend (``bench/gateway_load.py``'s system, ``bench/load_sessions.py``'s sessions). Nothing consumes the
pool, so it only grows.

Printed a row per --window-minutes: calls/s, p50 / p99 latency, the gateway's CPU per call, its anonymous resident
memory and its file-backed resident memory (the pool's mapped pages) at the window's end, the sessions it holds
and the pool's size; then the last window against the first (calls/s and p50 within 10 % is flat) and the calls made,
failed and recorded. ``--json`` prints every figure.

Usage: python bench/gateway_soak.py [--minutes 60] [--window-minutes 10] [--sessions 64] [--calls 8]
       [--path chat|messages|grpc] [--think-ms 0] [--tokens-per-s 50] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import re
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
from gateway_load import System, tree_cpu_s
from load_sessions import Load, run_client
from procfs import memory_kib

HELD_SESSIONS = re.compile(r"^forge_gateway_sessions_in_memory(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


def held_sessions(http_address: str) -> int:
    """The sessions the gateway holds in memory, from its Prometheus metrics."""
    text = urllib.request.urlopen(f"{http_address}/metrics", timeout=30).read().decode()
    found = HELD_SESSIONS.search(text)
    return int(float(found.group(1))) if found else -1


def sample(system: System) -> dict[str, float]:
    gateway = system.gateways[0]
    memory = memory_kib(gateway.proc.pid)
    return {"at": time.time(), "cpu_s": tree_cpu_s(gateway.proc.pid), "anon_mib": memory["anonymous"] / 1024,
            "file_mib": (memory["now"] - memory["anonymous"]) / 1024, "held_sessions": held_sessions(
                gateway.info["http_address"]), "pool_mib": system.pool_figures()["bytes_used"] / 2**20}


def windows(ended: np.ndarray, latencies: np.ndarray, samples: list[dict[str, float]]) -> list[dict[str, float]]:
    rows = []
    for before, after in itertools.pairwise(samples):
        inside = (ended >= before["at"]) & (ended < after["at"])
        calls = int(inside.sum())
        row = {"minute": (after["at"] - samples[0]["at"]) / 60, "seconds": after["at"] - before["at"], "calls": calls,
               "calls_per_s": calls / (after["at"] - before["at"]),
               "cpu_ms_per_call": (after["cpu_s"] - before["cpu_s"]) * 1e3 / max(calls, 1),
               **{k: after[k] for k in ("anon_mib", "file_mib", "held_sessions", "pool_mib")}}
        if calls:
            row["p50_ms"], row["p99_ms"] = (float(v) for v in np.percentile(latencies[inside], [50, 99]) * 1e3)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--window-minutes", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=64, help="session slots in flight")
    parser.add_argument("--calls", type=int, default=8, help="calls a session makes before it ends")
    parser.add_argument("--path", choices=["chat", "messages", "grpc"], default="chat")
    parser.add_argument("--clients", type=int, default=2, help="client processes holding the session slots")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--think-ms", type=float, default=0.0)
    parser.add_argument("--tokens-per-s", type=float, default=50.0)
    parser.add_argument("--first-token-ms", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.minutes <= 0 or not 0 < args.window_minutes <= args.minutes or args.sessions < 1 or args.calls < 1:
        parser.error("--minutes and --window-minutes (at most --minutes) must be positive, --sessions and --calls >= 1")
    system_args = argparse.Namespace(context=0, backend="loadtest", tokens_per_s=args.tokens_per_s,
                                     first_token_ms=args.first_token_ms, sessions=[args.sessions], gateways=1)
    system = System(Path(tempfile.mkdtemp(prefix="forge-gateway-soak-")), system_args)
    try:
        clients = max(1, min(args.clients, args.sessions))
        started = time.time()
        until = started + args.minutes * 60
        shares = [args.sessions // clients + (1 if k < args.sessions % clients else 0) for k in range(clients)]
        run = uuid.uuid4().hex[:8]
        loads = [Load(args.path, sum(shares[:k]), shares[k], args.calls, args.prompt_tokens, args.max_tokens,
                      args.think_ms / 1e3, system.targets, run, until=until, end_sessions=True)
                 for k in range(clients)]
        pool_before = system.pool_figures()["calls"]
        samples = [sample(system)]
        with multiprocessing.get_context("spawn").Pool(clients) as workers:
            pending = workers.map_async(run_client, loads)
            next_at = started + args.window_minutes * 60
            while not pending.ready():
                pending.wait(timeout=max(0.0, min(next_at, until) - time.time()))
                if time.time() >= next_at and next_at <= until + 1:
                    samples.append(sample(system))
                    next_at += args.window_minutes * 60
            outcomes = pending.get()
        samples.append(sample(system))
        recorded = system.pool_figures()["calls"] - pool_before
    finally:
        system.stop()
    ended = np.array([t for o in outcomes for t in o.ended])
    latencies = np.array([t for o in outcomes for t in o.latencies])
    rows = windows(ended, latencies, samples)
    failures = [f for o in outcomes for f in o.failures]
    summary = {"calls": len(latencies), "failed": len(failures), "recorded_calls": recorded,
               "first_failure": failures[0] if failures else None}
    full = [r for r in rows if r["calls"] and r["seconds"] >= 0.9 * args.window_minutes * 60]   # not the tail
    if len(full) >= 2:
        summary |= {"calls_per_s_last_over_first": full[-1]["calls_per_s"] / full[0]["calls_per_s"],
                    "p50_last_over_first": full[-1]["p50_ms"] / full[0]["p50_ms"]}
    if args.json:
        print(json.dumps({"args": vars(args), "windows": rows, "summary": summary}, indent=2))
        return
    print(f"{args.path}, {args.sessions} session slots, {args.calls} calls a session then ended, "
          f"{args.minutes:g} minutes, windows of {args.window_minutes:g}")
    print(f"{'minute':>6} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms':>7} {'anon MiB':>8} {'file MiB':>8} "
          f"{'held':>6} {'pool MiB':>8}")
    for r in rows:
        print(f"{r['minute']:>6.1f} {r['calls_per_s']:>8.1f} {r.get('p50_ms', 0):>8.1f} {r.get('p99_ms', 0):>8.1f} "
              f"{r['cpu_ms_per_call']:>7.2f} {r['anon_mib']:>8.1f} {r['file_mib']:>8.1f} {r['held_sessions']:>6.0f} "
              f"{r['pool_mib']:>8.1f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
