"""One Data Pool service, many gateways: acknowledged appends per second through ``forge pool serve`` over loopback
gRPC, against the same appends through an in-process ``Pool``.

Each run starts a real ``forge pool serve`` process (fresh directory, an API key, any free port) and 1, 4 and 8
"gateway" processes. Each gateway holds one ``PoolClient`` and drives it as a gateway does: every session is a
blocking call on a thread of its own (the gateway's pool executor), opened in a group of ``--group-size``, then
``--calls-per-session`` realistic calls appended with index -1 (bench/pool_append.py's calls: 1-4k prompt ids, 256
completion ids with log-probabilities and weight versions), then closed with a reward; ``--sessions`` run at once
per gateway, back to back (no model in the loop: this is the ceiling). The baseline runs the same sessions, as many
at once as all gateways together, through ``Pool`` in one process (a gateway started with ``--pool PATH``).

Only appends acknowledged inside the measured window count. For the limit, the run also reads the CPU time of the
service process, of the gateways, and of the whole machine (/proc), and the writer's figures (Stats): commits,
requests per commit, the writer's own submit-to-ack latency, and an estimate of how busy the writer thread is.

Usage: python bench/pool_service.py [--dir DIR] [--gateways 1 4 8] [--sessions 8] [--seconds 8] [--repeats 3]
                                    [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pool_append import realistic_calls

from forge.launch import ServiceProcess
from forge.v1 import pool_pb2

CLOCK_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Load:
    """What one gateway process (or the in-process baseline) does."""

    sessions: int                  # sessions in flight at once
    group_size: int
    calls_per_session: int
    warmup_s: float
    seconds: float


@dataclass
class Tally:
    """What one session thread saw inside the measured window."""

    appends: int = 0
    latencies: list[float] = field(default_factory=list)
    sessions: int = 0
    errors: list[str] = field(default_factory=list)


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def _machine_cpu() -> tuple[float, float, float]:
    """(busy, iowait, total) CPU seconds of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle, iowait = values[3], values[4]
    total = sum(values[:8])
    return (total - idle - iowait) / CLOCK_TICK, iowait / CLOCK_TICK, total / CLOCK_TICK


def _session_loop(pool: Any, template: list[pool_pb2.CallRecord], name: str, slot: int, load: Load, begin: float,
                  start: float, stop: float, tally: Tally) -> None:
    """One session slot of a gateway: open (in a group), append, close, over and over until ``stop``."""
    time.sleep(max(0.0, begin - time.monotonic()))
    round_ = 0
    while time.monotonic() < stop:
        group = f"{name}-g{slot // load.group_size}-r{round_}"
        try:
            session = pool.open_session(pool_pb2.OpenSessionRequest(
                task_id=f"task-{slot // load.group_size}", domain="bench", group_id=group,
                group_size=load.group_size))
            for turn in range(load.calls_per_session):
                if time.monotonic() >= stop:
                    break
                record = pool_pb2.CallRecord()
                record.CopyFrom(template[(slot * 7919 + round_ * load.calls_per_session + turn) % len(template)])
                record.session_id, record.index, record.created_at = session.session_id, -1, time.time()
                sent = time.monotonic()
                pool.append_call(record)
                acked = time.monotonic()
                if start <= acked <= stop:
                    tally.appends += 1
                    tally.latencies.append(acked - sent)
            pool.close_session(pool_pb2.CloseSessionRequest(
                session_id=session.session_id, outcome_rewards={"correct": 1.0},
                metrics={"turns": float(load.calls_per_session)}))
            if start <= time.monotonic() <= stop:
                tally.sessions += 1
        except Exception as exc:        # reported, and the run refused: a benchmark with errors measures nothing
            tally.errors.append(f"{type(exc).__name__}: {exc}")
            return
        round_ += 1


def _writer_figures(stats: dict[str, float]) -> dict[str, float]:
    keys = ("commits_total", "requests_total", "appends_total", "commit_latency_ms_p50", "append_latency_ms_p50")
    return {key: stats.get(key, 0.0) for key in keys}


def gateway_process(conn: Connection, name: str, address: str | None, path: str | None, api_key: str | None,
                    payloads: list[bytes], load: Load, sample_stats: bool) -> None:
    """A gateway (``address``: a PoolClient of the service) or the in-process baseline (``path``: a Pool)."""
    if address is not None:
        from forge.pool import PoolClient

        pool: Any = PoolClient(address, api_key=api_key)
        pool.cursor()                   # as a gateway checks the service at start
    else:
        from forge.pool import Pool

        pool = Pool(path)
    template = [pool_pb2.CallRecord.FromString(p) for p in payloads]
    conn.send("ready")
    begin, start, stop = conn.recv()
    tallies = [Tally() for _ in range(load.sessions)]
    threads = [threading.Thread(target=_session_loop, args=(pool, template, name, slot, load, begin, start, stop,
                                                            tallies[slot]), daemon=True)
               for slot in range(load.sessions)]
    for thread in threads:
        thread.start()
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0 = time.process_time()
    if sample_stats:
        before = _writer_figures(pool.stats())
    time.sleep(max(0.0, stop - time.monotonic()))
    cpu1 = time.process_time()
    if sample_stats:
        after = _writer_figures(pool.stats())
    for thread in threads:
        thread.join()
    pool.close()
    conn.send({"appends": sum(t.appends for t in tallies), "sessions": sum(t.sessions for t in tallies),
               "latencies": [x for t in tallies for x in t.latencies], "errors": [e for t in tallies for e in t.errors],
               "cpu_s": cpu1 - cpu0, "before": before, "after": after})
    conn.close()


def start_pool_service(directory: Path, api_key: str) -> ServiceProcess:
    """``forge pool serve`` on loopback, any free port, its API key in its environment (never on a command line)."""
    return ServiceProcess(directory.name, "forge", ["pool", "serve", "--path", str(directory), "--port", "0",
                                                     "--log-level", "warning"],
                          directory.parent, env={"FORGE_POOL_API_KEY": api_key}, timeout_s=60)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_once(root: Path, payloads: list[bytes], gateways: int, load: Load, service: bool) -> dict[str, float]:
    """One measured run: ``gateways`` processes against a fresh service, or one in-process pool carrying as many
    sessions as ``gateways`` gateways together."""
    directory = Path(tempfile.mkdtemp(dir=root))
    context = multiprocessing.get_context("spawn")
    server = None
    api_key = secrets.token_hex(16)
    try:
        if service:
            server = start_pool_service(directory / "pool", api_key)
            plans = [(f"gw{g}", server.info["address"], None, load) for g in range(gateways)]
        else:
            inproc = Load(load.sessions * gateways, load.group_size, load.calls_per_session, load.warmup_s,
                          load.seconds)
            plans = [("inproc", None, str(directory / "pool"), inproc)]
        pipes, procs = [], []
        for index, (name, address, path, plan) in enumerate(plans):
            parent, child = context.Pipe()
            proc = context.Process(target=gateway_process, args=(child, name, address, path, api_key, payloads,
                                                                 plan, index == 0), daemon=True)
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        for parent in pipes:
            if not parent.poll(120) or parent.recv() != "ready":
                raise RuntimeError("a gateway process did not start")
        begin = time.monotonic() + 0.2
        start, stop = begin + load.warmup_s, begin + load.warmup_s + load.seconds
        for parent in pipes:
            parent.send((begin, start, stop))
        time.sleep(max(0.0, start - time.monotonic()))
        server_cpu0 = _process_cpu_s(server.proc.pid) if server else 0.0
        machine0 = _machine_cpu()
        time.sleep(max(0.0, stop - time.monotonic()))
        server_cpu1 = _process_cpu_s(server.proc.pid) if server else 0.0
        machine1 = _machine_cpu()
        results = [parent.recv() for parent in pipes]
        for proc in procs:
            proc.join(30)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    errors = [e for r in results for e in r["errors"]]
    if errors:
        raise RuntimeError(f"{len(errors)} failed pool calls, e.g. {errors[0]}")
    window = load.seconds
    latencies = [x for r in results for x in r["latencies"]]
    appends = sum(r["appends"] for r in results)
    before, after = results[0]["before"], results[0]["after"]
    commits = after["commits_total"] - before["commits_total"]
    requests = after["requests_total"] - before["requests_total"]
    busy, iowait, total = (b - a for a, b in zip(machine0, machine1, strict=True))
    gateway_cpu = sum(r["cpu_s"] for r in results)
    return {"appends_per_s": appends / window, "per_gateway": appends / window / gateways,
            "p50_ms": 1e3 * _percentile(latencies, 0.5), "p99_ms": 1e3 * _percentile(latencies, 0.99),
            "sessions_per_s": sum(r["sessions"] for r in results) / window,
            "requests_per_commit": requests / commits if commits else float("nan"),
            "commits_per_s": commits / window,
            "writer_busy": commits * after["commit_latency_ms_p50"] / 1e3 / window,
            "writer_ack_p50_ms": after["append_latency_ms_p50"],
            "service_cpu": (server_cpu1 - server_cpu0) / window if server else float("nan"),
            "gateways_cpu": gateway_cpu / window,
            "service_ms_per_append": (1e3 * (server_cpu1 - server_cpu0) / appends if server and appends
                                      else float("nan")),
            "gateways_ms_per_append": 1e3 * gateway_cpu / appends if appends else float("nan"),
            "machine_busy": busy / total if total else float("nan"),
            "machine_iowait": iowait / total if total else float("nan")}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("."), help="where to create the scratch pools (a real disk)")
    parser.add_argument("--gateways", type=int, nargs="+", default=[1, 4, 8], help="gateway processes per run")
    parser.add_argument("--sessions", type=int, default=8, help="sessions in flight per gateway")
    parser.add_argument("--group-size", type=int, default=4, help="sessions per group (divides --sessions)")
    parser.add_argument("--calls-per-session", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window of each run")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds of load before the window opens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--distinct", type=int, default=256, help="distinct realistic calls, cycled through")
    parser.add_argument("--no-baseline", action="store_true", help="skip the in-process runs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    if args.sessions % args.group_size:
        parser.error("--group-size must divide --sessions")
    load = Load(args.sessions, args.group_size, args.calls_per_session, args.warmup, args.seconds)
    calls = realistic_calls(args.distinct)
    payloads = [c.SerializeToString() for c in calls]
    size = statistics.mean(map(len, payloads))
    root = Path(tempfile.mkdtemp(prefix="pool-service-bench-", dir=args.dir))
    print(f"{size / 1024:.1f} KiB per call on average (protobuf); {args.sessions} sessions per gateway in groups of "
          f"{args.group_size}, {args.calls_per_session} calls each; {args.seconds:g} s windows; {args.repeats} runs "
          f"each (medians); {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; scratch under "
          f"{root}", flush=True)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for repeat in range(args.repeats):
            for gateways in args.gateways:
                kinds = ("service",) if args.no_baseline else ("in-process", "service")
                for kind in kinds:
                    result = run_once(root, payloads, gateways, load, kind == "service")
                    runs.setdefault((kind, gateways), []).append(result)
                    print(f"  run {repeat + 1}: {kind:10s} {gateways} x {args.sessions} sessions: "
                          f"{result['appends_per_s']:7.0f} appends/s  p50 {result['p50_ms']:6.1f} ms  "
                          f"p99 {result['p99_ms']:6.1f} ms  service CPU {result['service_cpu']:.2f}  "
                          f"machine {100 * result['machine_busy']:.0f}%", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {key: {name: statistics.median(r[name] for r in results) for name in results[0]}
               for key, results in runs.items()}

    print()
    print(_row(["gateways", "sessions in flight", "in-process appends/s", "p50 / p99 ms", "service appends/s",
                "per gateway", "p50 / p99 ms", "service / in-process"]))
    print(_row(["---:"] * 8))
    for gateways in args.gateways:
        s = medians[("service", gateways)]
        b = medians.get(("in-process", gateways))
        print(_row([str(gateways), str(gateways * args.sessions),
                    f"{b['appends_per_s']:,.0f}" if b else "-",
                    f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f}" if b else "-",
                    f"{s['appends_per_s']:,.0f}", f"{s['per_gateway']:,.0f}",
                    f"{s['p50_ms']:.1f} / {s['p99_ms']:.1f}",
                    f"{s['appends_per_s'] / b['appends_per_s']:.2f}x" if b else "-"]))
    print()
    print(_row(["run", "service CPU: cores", "ms per append", "gateways CPU: cores", "ms per append",
                "machine busy", "requests per commit", "commits/s", "writer busy (est.)", "writer ack p50 ms"]))
    print(_row(["---"] + ["---:"] * 9))
    for (kind, gateways), m in medians.items():
        label = f"{kind}, {gateways} x {args.sessions} sessions" if kind == "service" else \
            f"{kind}, {gateways * args.sessions} sessions"
        service = kind == "service"
        print(_row([label, f"{m['service_cpu']:.2f}" if service else "-",
                    f"{m['service_ms_per_append']:.2f}" if service else "-", f"{m['gateways_cpu']:.2f}",
                    f"{m['gateways_ms_per_append']:.2f}", f"{100 * m['machine_busy']:.0f}%",
                    f"{m['requests_per_commit']:.1f}", f"{m['commits_per_s']:,.0f}", f"{100 * m['writer_busy']:.0f}%",
                    f"{m['writer_ack_p50_ms']:.1f}"]))
    if args.json:
        print(json.dumps({f"{kind}, {gateways} gateways": m for (kind, gateways), m in medians.items()}, indent=2))


if __name__ == "__main__":
    main()
