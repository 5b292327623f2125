"""Prefill/decode disaggregation against co-location, on the same compute: P prefill + D decode actors behind a
disaggregated gateway, against P + D ``both`` actors behind the cost-aware router (the gateway's default). Both
set-ups have a ``forge-cache`` (the co-located actors publish and fetch through it too) and one thread per actor.

Workload, identical for both (seeded): ``--sessions`` multi-turn agent sessions run at once; each starts from its own
system prompt of ``--system`` tokens and for ``--turns`` turns appends a tool result of ``--tool`` tokens and asks
for ``--new-tokens`` tokens, so its context grows to system + turns x (tool + new) tokens; beside them
``--short-clients`` clients make short single-turn calls (``--short-prompt`` tokens, ``--new-tokens`` new) one after
another until the sessions are done. Calls go through the gateway's token-level gRPC Generate (the actor sees
exactly these ids). Model: a random-weight Qwen3 of the ``small`` shape (context 4,096), written once.

Reported per set-up and kind of call: time to first token (mean, p99) and time per output token after it (mean,
p99), calls per second, and the rollout wall-clock (until every session is done), with ratios disaggregated /
co-located. The gateway's prefill figures say how many calls took the prefill pool.

Usage: python bench/pd_disaggregation.py [--prefill 1] [--decode 1] [--sessions 4] [--turns 8] [--system 1500]
       [--tool 250] [--new-tokens 24] [--short-clients 2] [--short-prompt 48] [--repeats 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from forge.checkpoints.random_qwen3 import write_qwen3
from forge.launch import ServiceProcess
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

VOCAB = 1000                      # token ids drawn below the small shape's vocabulary (1,024)


def start_fleet(root: Path, model: Path, prefill: int, decode: int, disaggregated: bool) -> list[ServiceProcess]:
    """forge-cache, the actors and a gateway; the gateway last in the list."""
    name = "pd" if disaggregated else "co"
    cache = ServiceProcess(f"{name}-cache", "forge-cache", ["--dir", str(root / f"{name}-cache"), "--port", "0"],
                           root, timeout_s=60)
    common = ["--model", str(model), "--port", "0", "--threads", "1", "--kv-cache-mb", "256",
              "--l3-cache", cache.info["address"]]
    roles = ["prefill"] * prefill + ["decode"] * decode if disaggregated else ["both"] * (prefill + decode)
    actors = [ServiceProcess(f"{name}-actor-{i}", "forge-actor", [*common, "--role", role], root, timeout_s=300)
              for i, role in enumerate(roles)]
    wiring = []
    for actor, role in zip(actors, roles, strict=True):
        wiring += ["--prefill-actor" if role == "prefill" else "--actor", actor.info["address"]]
    gateway = ServiceProcess(f"{name}-gateway", "forge-gateway", [
        "--model", str(model), "--pool", str(root / f"{name}-pool"), "--grpc-port", "0", "--http-port", "0",
        "--log-level", "WARNING", *wiring], root, timeout_s=120)
    return [cache, *actors, gateway]


async def one_call(stub, session_id: str, prompt: list[int], new_tokens: int, seed: int) -> tuple[float, float, int]:
    """(time to first token, time per later token, tokens) of one call."""
    sampling = common_pb2.SamplingParams(temperature=1.0, seed=seed, max_tokens=new_tokens, ignore_eos=True)
    started, first, last, count = time.perf_counter(), None, 0.0, 0
    async for chunk in stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=prompt,
                                                                        sampling=sampling)):
        if chunk.token_ids:
            now = time.perf_counter()
            first = now if first is None else first
            last = now
            count += len(chunk.token_ids)
    first = first if first is not None else time.perf_counter()
    return first - started, (last - first) / max(1, count - 1), count


async def workload(address: str, args: argparse.Namespace, seed: int) -> dict:
    took: dict[str, list[tuple[float, float, int]]] = {"multi-turn": [], "short": []}
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def session(s: int) -> None:
            rng = random.Random(seed * 1000 + s)
            sid = (await stub.StartSession(gateway_pb2.StartSessionRequest(task_id=f"pd-{s}"))).session.session_id
            context = [rng.randrange(3, VOCAB) for _ in range(args.system)]
            for turn in range(args.turns):
                context += [rng.randrange(3, VOCAB) for _ in range(args.tool)]
                result = await one_call(stub, sid, context, args.new_tokens, seed * 100_000 + s * 100 + turn)
                took["multi-turn"].append(result)
                context += [rng.randrange(3, VOCAB) for _ in range(result[2])]    # stands in for its completion
            await stub.EndSession(gateway_pb2.EndSessionRequest(session_id=sid))

        done = asyncio.Event()

        async def short_client(c: int) -> None:
            rng, i = random.Random(seed * 7919 + c), 0
            while not done.is_set():
                sid = (await stub.StartSession(gateway_pb2.StartSessionRequest(task_id="short"))).session.session_id
                prompt = [rng.randrange(3, VOCAB) for _ in range(args.short_prompt)]
                took["short"].append(await one_call(stub, sid, prompt, args.new_tokens, c * 1_000_000 + i))
                await stub.EndSession(gateway_pb2.EndSessionRequest(session_id=sid))
                i += 1

        started = time.perf_counter()
        shorts = [asyncio.create_task(short_client(c)) for c in range(args.short_clients)]
        await asyncio.gather(*(session(s) for s in range(args.sessions)))
        wall = time.perf_counter() - started
        done.set()
        await asyncio.gather(*shorts)
        report = await stub.Stats(common_pb2.StatsRequest())
    figures: dict = {"rollout_s": wall, "calls_per_s": sum(len(v) for v in took.values()) / wall,
                     "prefills": report.gauges.get("prefills", 0.0),
                     "prefill_skipped": report.gauges.get("prefill_skipped", 0.0)}
    for kind, calls in took.items():
        ttft, tpot = np.array([c[0] for c in calls]) * 1e3, np.array([c[1] for c in calls]) * 1e3
        figures[kind] = {"calls": len(calls), "ttft_ms_mean": float(ttft.mean()), "ttft_ms_p99":
                         float(np.percentile(ttft, 99)), "tpot_ms_mean": float(tpot.mean()),
                         "tpot_ms_p99": float(np.percentile(tpot, 99))}
    return figures


def median_of(runs: list[dict]) -> dict:
    out: dict = {}
    for key, value in runs[0].items():
        out[key] = median_of([r[key] for r in runs]) if isinstance(value, dict) else \
            statistics.median(r[key] for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, default=1, help="prefill actors (co-located: as many more both)")
    parser.add_argument("--decode", type=int, default=1, help="decode actors (co-located: as many more both)")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system", type=int, default=1500)
    parser.add_argument("--tool", type=int, default=250)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--short-clients", type=int, default=2)
    parser.add_argument("--short-prompt", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    longest = args.system + args.turns * (args.tool + args.new_tokens)
    if longest >= 4096:
        parser.error(f"the sessions' contexts would reach {longest} tokens; the model's context is 4,096")
    results: dict[str, list[dict]] = {"co-located": [], "disaggregated": []}
    with tempfile.TemporaryDirectory(prefix="forge-pd-bench-") as scratch:
        root = Path(scratch)
        model = write_qwen3(root / "model", "small")
        for setup in results:
            fleet = start_fleet(root, model, args.prefill, args.decode, setup == "disaggregated")
            try:
                address = fleet[-1].info["grpc_address"]
                asyncio.run(workload(address, argparse.Namespace(**{**vars(args), "sessions": 1, "turns": 2}), 99))
                for repeat in range(args.repeats):
                    results[setup].append(asyncio.run(workload(address, args, repeat)))
            finally:
                for service in reversed(fleet):
                    service.stop()
    summary = {setup: median_of(runs) for setup, runs in results.items()}
    if args.json:
        print(json.dumps({"args": vars(args), "results": summary}, indent=2))
        return
    co, pd = summary["co-located"], summary["disaggregated"]
    print(f"{args.prefill} prefill + {args.decode} decode actors against {args.prefill + args.decode} co-located; "
          f"{args.sessions} sessions of {args.turns} turns (context to {longest} tokens) and {args.short_clients} "
          f"short-call clients; medians of {args.repeats} run(s)")
    print(f"{'calls':>10} {'set-up':>14} {'n':>5} {'TTFT mean':>10} {'TTFT p99':>9} {'TPOT mean':>10} "
          f"{'TPOT p99':>9}  (ms)")
    for kind in ("multi-turn", "short"):
        for setup, figures in summary.items():
            f = figures[kind]
            print(f"{kind:>10} {setup:>14} {f['calls']:>5.0f} {f['ttft_ms_mean']:>10.1f} {f['ttft_ms_p99']:>9.1f} "
                  f"{f['tpot_ms_mean']:>10.1f} {f['tpot_ms_p99']:>9.1f}")
        print(f"{kind:>10} {'ratio pd/co':>14} {'':>5} {pd[kind]['ttft_ms_mean'] / co[kind]['ttft_ms_mean']:>10.2f} "
              f"{pd[kind]['ttft_ms_p99'] / co[kind]['ttft_ms_p99']:>9.2f} "
              f"{pd[kind]['tpot_ms_mean'] / co[kind]['tpot_ms_mean']:>10.2f} "
              f"{pd[kind]['tpot_ms_p99'] / co[kind]['tpot_ms_p99']:>9.2f}")
    print(f"rollout wall-clock: co-located {co['rollout_s']:.1f} s, disaggregated {pd['rollout_s']:.1f} s "
          f"({pd['rollout_s'] / co['rollout_s']:.2f}x); calls/s {co['calls_per_s']:.2f} against "
          f"{pd['calls_per_s']:.2f}; calls through the prefill pool {pd['prefills']:.0f}, skipping it "
          f"{pd['prefill_skipped']:.0f}")


if __name__ == "__main__":
    main()
