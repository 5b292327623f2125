"""The middleware at load: many multi-turn sessions in flight through the gateway(s) and the pool, against an actor
on the load-test backend (``forge-actor --backend loadtest``: tokens at a set pace from no model, so what is measured
is the middleware alone) or on the torch engine, beside the same sessions calling the actor directly.

Each session opens with a user turn of about --prompt-tokens tokens and makes --calls calls; after each, it adds the
reply and a new user turn, so its context grows by both every call, and waits --think-ms (the agent's own time: the
session stays open, idle). --clients processes hold the sessions between them (``bench/load_sessions.py``). Paths:

- direct:   the actor's gRPC GenerateWhole (one answer at the end, as the gateway asks for a non-streaming call)
            with the prompt the client built before it starts the clock, as the gateway builds it (the earlier calls'
            ids reused, so the actor's prefix cache sees the same prompts); nothing is recorded;
- chat:     OpenAI chat completions over HTTP, at /s/<session>/v1 (a black-box agent);
- messages: Anthropic Messages over HTTP, at /s/<session>/v1;
- grpc:     the gateway's gRPC ChatWhole, each call answered as one message (a white-box agent);
- grpc-stream: its Chat, streamed token by token;
- generate: the gateway's gRPC GenerateWhole with the prompt ids the client built as direct's are built: a white-box
            agent that manages its own context, token in, token out;
- litellm:  chat's calls sent to a LiteLLM proxy (``bench/litellm_proxy.py``, the proxy teams put in front of vLLM
            to log calls) at /v1, which forwards them to the gateway with the session in X-Forge-Session-Id; the
            peer baseline. It needs LiteLLM's own environment (``.venv-litellm``, see that module) and one gateway.

With --gateways N > 1 the gateways record into one ``forge pool serve`` and share the actor; each session is pinned
to gateway (its number mod N), as ``forge deploy --gateways N`` pins them by id.

Reported per number of sessions and path: calls and sessions a second, p50 / p99 latency and what the path adds to
direct's, the gateways' CPU per call (their children included) and, for litellm, the proxy's (its process tree), the
gateways' anonymous resident memory per session left open at the end (from the last repeat, once the first has set
the allocator's high-water mark), and the pool's bytes per call and per new token (the turn's new prompt tokens and
its completion) against the 8 bytes an id and its log-prob hold; with ``--json``, also the client processes' own CPU
a call and the new tokens a call (the same on every path: each does the same work). ``--stages`` runs the gateways under
``bench/gateway_stages.py`` and adds their CPU a call by stage of a call. ``--json`` prints every figure and the counts
(calls made, failed, calls and sessions recorded in the pool) the test suite's smoke run checks.

Usage: python bench/gateway_load.py [--sessions 64 256 1024] [--calls 8] [--paths direct chat litellm grpc ...]
       [--backend loadtest|torch] [--gateways 1] [--clients 2] [--prompt-tokens 256] [--max-tokens 32]
       [--think-ms 0] [--tokens-per-s 50] [--context 262144] [--stages] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import secrets
import shutil
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import gateway_stages
import numpy as np
from litellm_proxy import LiteLLMProxy
from load_sessions import Load, run_client
from procfs import children, cpu_s, memory_kib

from forge.launch import ServiceProcess
from forge.pool.pool import PoolReader

PATHS = ("direct", "chat", "messages", "grpc", "grpc-stream", "generate", "litellm")
BYTES_PER_TOKEN = 8            # an int32 id and a float32 log-prob
# Memory a session holds is read from the last repeat: the first leaves the allocator at the high-water mark of that
# many calls in flight at once, which a later repeat of the same load reuses instead of growing.
LAST_REPEAT = frozenset({"gateway_anon_kib_per_session"})


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and of its children still running."""
    total = 0.0
    for one in (pid, *children(pid)):
        with contextlib.suppress(FileNotFoundError):        # a child that has just ended
            total += cpu_s(one)
    return total


def long_context_model(root: Path, context: int) -> Path:
    """The built-in tiny model's tokenizer and config with a context of ``context`` tokens: what the load-test backend
    and the gateway read of a model (no weights), for sessions longer than the tiny model's own context."""
    from forge.assets import TINY_DIR

    directory = root / f"tiny-{context}"
    shutil.copytree(TINY_DIR, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    return directory


class System:
    """The actor, the pool service (several gateways) and the gateways, started in ``root``."""

    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root, self.services = root, []
        model = ["--model", str(long_context_model(root, args.context))] if args.context else []
        backend = ["--backend", "loadtest", "--loadtest-tokens-per-s", str(args.tokens_per_s),
                   "--loadtest-first-token-ms", str(args.first_token_ms)] if args.backend == "loadtest" else \
            ["--backend", "torch", "--kv-cache-mb", "512", "--threads", "1"]
        most = max(args.sessions)
        self.actor = self._start("actor", "forge-actor", ["--port", "0", *model, *backend,
                                                          "--max-batch", str(min(most, 256)),
                                                          "--max-waiting", str(most + 64), "--log-level", "WARNING"])
        self.pool_dir = root / "pool"
        self.pool_key = secrets.token_hex(16)
        if args.gateways > 1:
            self.pool = self._start("pool", "forge", ["pool", "serve", "--path", str(self.pool_dir), "--port", "0",
                                                      "--log-level", "warning"], {"FORGE_POOL_API_KEY": self.pool_key})
            recording = ["--pool-address", self.pool.info["address"]]
        else:
            recording = ["--pool", str(self.pool_dir)]
        self.stage_files = [root / f"stages-{g}.json" for g in range(args.gateways)] \
            if getattr(args, "stages", False) else []
        gateway = str(Path(gateway_stages.__file__)) if self.stage_files else "forge-gateway"
        self.gateways = [self._start(f"gateway-{g}", gateway,
                                     ["--actor", self.actor.info["address"], *model, *recording, "--grpc-port", "0",
                                      "--http-port", "0", "--log-level", "WARNING"],
                                     ({"FORGE_GATEWAY_POOL_API_KEY": self.pool_key} if args.gateways > 1 else {})
                                     | ({gateway_stages.OUT_ENV: str(self.stage_files[g])} if self.stage_files else {}))
                         for g in range(args.gateways)]
        self.proxy: LiteLLMProxy | None = None
        if "litellm" in getattr(args, "paths", ()):        # the peer baseline, in front of the (one) gateway
            self.proxy = LiteLLMProxy(root, self.gateways[0].info["http_address"])
            self.services.append(self.proxy)

    def _start(self, name: str, command: str, arguments: list[str], env: dict[str, str] | None = None):
        service = ServiceProcess(name, command, arguments, self.root, env=env, timeout_s=300)
        self.services.append(service)
        return service

    @property
    def targets(self) -> dict[str, list[str]]:
        return {"direct": [self.actor.info["address"]], "chat": [g.info["http_address"] for g in self.gateways],
                "messages": [g.info["http_address"] for g in self.gateways],
                "grpc": [g.info["grpc_address"] for g in self.gateways],
                "grpc-stream": [g.info["grpc_address"] for g in self.gateways],
                "generate": [g.info["grpc_address"] for g in self.gateways],
                "litellm": [self.proxy.url] if self.proxy else []}

    def stage_totals(self) -> dict[str, list[float]]:
        """CPU seconds and calls of each stage of a call in the gateways so far (``--stages``)."""
        totals = {stage: [0.0, 0] for stage in gateway_stages.STAGES}
        for gateway, path in zip(self.gateways, self.stage_files, strict=True):
            before = (gateway_stages.read(path) or {}).get("written", 0)
            gateway.proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 120
            while (now := gateway_stages.read(path)) is None or now["written"] == before:
                if time.monotonic() > deadline or not gateway.alive:
                    raise RuntimeError(f"{gateway.name} wrote no stage figures (see {gateway.log_path})")
                time.sleep(0.02)
            for stage, figures in now["stages"].items():
                totals[stage][0] += figures["cpu_s"]
                totals[stage][1] += figures["calls"]
        return totals

    def pool_figures(self) -> dict[str, float]:
        with PoolReader(self.pool_dir) as pool:
            return pool.stats()

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


def measure(system: System, path: str, sessions: int, args: argparse.Namespace) -> dict[str, float]:
    run = uuid.uuid4().hex[:8]
    clients = max(1, min(args.clients, sessions))
    shares = [sessions // clients + (1 if k < sessions % clients else 0) for k in range(clients)]
    firsts = [sum(shares[:k]) for k in range(clients)]
    loads = [Load(path, first, count, args.calls, args.prompt_tokens, args.max_tokens, args.think_ms / 1e3,
                  system.targets, run) for first, count in zip(firsts, shares, strict=True)]
    gateway_pids = [g.proc.pid for g in system.gateways]
    cpu_before = sum(tree_cpu_s(pid) for pid in gateway_pids)
    memory_before = sum(memory_kib(pid)["anonymous"] for pid in gateway_pids)
    proxy = system.proxy if path == "litellm" else None
    proxy_before = proxy.cpu_s() if proxy else 0.0
    pool_before = system.pool_figures()
    stages_before = system.stage_totals() if system.stage_files else {}
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(clients) as workers:
        outcomes = workers.map(run_client, loads)
    wall = time.perf_counter() - started
    proxy_cpu_s = proxy.cpu_s() - proxy_before if proxy else 0.0
    calls_made = sum(len(o.latencies) for o in outcomes)
    failures = [f for o in outcomes for f in o.failures]
    latencies = [t for o in outcomes for t in o.latencies]
    pool_after = system.pool_figures()
    recorded = pool_after["calls"] - pool_before["calls"]
    written = pool_after["bytes_used"] - pool_before["bytes_used"]
    new_tokens = sum(o.new_tokens for o in outcomes)
    figures = {"sessions": sessions, "calls": calls_made, "failed": len(failures), "recorded_calls": recorded,
               "recorded_sessions": pool_after["sessions"] - pool_before["sessions"],
               "calls_per_s": calls_made / wall, "sessions_per_s": sessions / wall,
               "new_tokens_per_call": new_tokens / max(calls_made, 1),
               "client_cpu_ms_per_call": sum(o.cpu_s for o in outcomes) * 1e3 / max(calls_made, 1)}
    if latencies:
        p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
        figures |= {"p50_ms": float(p50), "p99_ms": float(p99)}
    if path != "direct" and calls_made:
        figures |= {"gateway_cpu_ms_per_call": (sum(tree_cpu_s(pid) for pid in gateway_pids) - cpu_before) * 1e3
                    / calls_made,
                    "gateway_anon_kib_per_session":
                        (sum(memory_kib(pid)["anonymous"] for pid in gateway_pids) - memory_before) / sessions,
                    "pool_bytes_per_call": written / max(recorded, 1),
                    "pool_bytes_per_new_token": written / max(new_tokens, 1) / BYTES_PER_TOKEN}
    if stages_before and path != "direct" and calls_made:
        stages_after = system.stage_totals()
        for stage, (cpu_before, calls_before) in stages_before.items():
            figures[f"stage_{stage}_ms"] = (stages_after[stage][0] - cpu_before) * 1e3 / calls_made
            figures[f"stage_{stage}_calls"] = stages_after[stage][1] - calls_before
        figures["stage_rest_ms"] = figures["gateway_cpu_ms_per_call"] - sum(
            figures[f"stage_{stage}_ms"] for stage in stages_before)
    if proxy and calls_made:
        figures["proxy_cpu_ms_per_call"] = proxy_cpu_s * 1e3 / calls_made
    if failures:
        figures["first_failure"] = failures[0]          # type: ignore[assignment]
    return figures


def report(results: dict[int, dict[str, dict[str, float]]], args: argparse.Namespace) -> None:
    print(f"backend {args.backend}, {args.gateways} gateway(s), {args.calls} calls a session, prompt ~"
          f"{args.prompt_tokens} tokens, {args.max_tokens} new tokens a call, think {args.think_ms:g} ms; medians of "
          f"{args.repeats} runs; +ms: added to direct's (litellm's: the proxy's and the gateway's); CPU: ms a call")
    print(f"{'sessions':>8} {'path':>9} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} {'+p99':>7} "
          f"{'gw CPU':>7} {'proxy CPU':>9} {'KiB/sess':>8} {'pool B/call':>11} {'pool x/tok':>10} {'failed':>6}")
    for sessions, paths in results.items():
        base = paths.get("direct")
        for path, r in paths.items():
            added = ("", "")
            if base and path != "direct" and "p50_ms" in r:
                added = (f"{r['p50_ms'] - base['p50_ms']:+.1f}", f"{r['p99_ms'] - base['p99_ms']:+.1f}")
            gateway = ("", "", "", "") if "gateway_cpu_ms_per_call" not in r else (
                f"{r['gateway_cpu_ms_per_call']:.2f}", f"{r['gateway_anon_kib_per_session']:.1f}",
                f"{r['pool_bytes_per_call']:.0f}", f"{r['pool_bytes_per_new_token']:.2f}")
            proxy = f"{r['proxy_cpu_ms_per_call']:.2f}" if "proxy_cpu_ms_per_call" in r else ""
            print(f"{sessions:>8} {path:>9} {r['calls_per_s']:>8.1f} {r.get('p50_ms', 0):>8.1f} "
                  f"{r.get('p99_ms', 0):>8.1f} {added[0]:>7} {added[1]:>7} {gateway[0]:>7} {proxy:>9} {gateway[1]:>8} "
                  f"{gateway[2]:>11} {gateway[3]:>10} {int(r['failed']):>6}")
    staged = [(sessions, path, r) for sessions, paths in results.items() for path, r in paths.items()
              if "stage_rest_ms" in r]
    if staged:
        names = [*gateway_stages.STAGES, "rest"]
        print("\ngateway CPU a call by stage, ms (thread CPU of each stage's functions; rest: the transports, the "
              "event loop and the glue between stages)")
        print(f"{'sessions':>8} {'path':>9} " + " ".join(f"{n:>10}" for n in names))
        for sessions, path, r in staged:
            print(f"{sessions:>8} {path:>9} " + " ".join(f"{r[f'stage_{n}_ms']:>10.3f}" for n in names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--calls", type=int, default=8, help="calls a session makes, one after another")
    parser.add_argument("--paths", nargs="+", default=["direct", "chat", "grpc"], choices=PATHS)
    parser.add_argument("--backend", choices=["loadtest", "torch"], default="loadtest")
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--clients", type=int, default=2, help="client processes holding the sessions")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="about how long a session's first turn is")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens a call")
    parser.add_argument("--think-ms", type=float, default=0.0, help="a session's wait between its calls")
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="loadtest: each request's decode pace")
    parser.add_argument("--first-token-ms", type=float, default=20.0, help="loadtest: each request's first token")
    parser.add_argument("--context", type=int, default=0,
                        help="loadtest: serve a model of this context (the tiny model's tokenizer), for long sessions")
    parser.add_argument("--stages", action="store_true",
                        help="also break the gateways' CPU down by stage of a call (bench/gateway_stages.py)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.sessions) < 1 or args.calls < 1 or args.gateways < 1 or args.clients < 1:
        parser.error("--sessions, --calls, --gateways and --clients must be at least 1")
    if args.context and (args.backend != "loadtest" or args.context < 64):
        parser.error("--context serves the load-test backend a longer context: give --backend loadtest and at least 64")
    if "litellm" in args.paths and args.gateways != 1:
        parser.error("the litellm path routes to one gateway: give --gateways 1")
    root = Path(tempfile.mkdtemp(prefix="forge-gateway-load-"))
    system = System(root, args)
    results: dict[int, dict[str, dict[str, float]]] = {}
    try:
        for path in args.paths:                             # warm up every path
            measure(system, path, 2, argparse.Namespace(**{**vars(args), "calls": 1}))
        for sessions in args.sessions:
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in args.paths}
            for _ in range(args.repeats):
                for path in args.paths:                     # interleaved, so drift hits every path alike
                    runs[path].append(measure(system, path, sessions, args))
            results[sessions] = {p: {k: (rs[-1][k] if k in LAST_REPEAT else statistics.median(r[k] for r in rs)
                                         if isinstance(rs[0][k], float | int) else rs[0][k]) for k in rs[0]}
                                 for p, rs in runs.items()}
    finally:
        system.stop()
    if args.json:
        print(json.dumps({"args": vars(args), "results": results}, indent=2))
    else:
        report(results, args)


if __name__ == "__main__":
    main()
