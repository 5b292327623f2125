"""What the gateway adds to an LLM call: latency and throughput through the gateway against calling the actor
directly, on the same prompts and the same sampled tokens.

It starts one actor (built-in tiny model) and one gateway (with a fresh local pool: every gateway call is rendered,
tokenised, routed, streamed and durably recorded before it is answered). C concurrent sessions each make calls one
after another; each call is the session's own single-turn prompt, max_tokens new tokens (ignore_eos, a fixed seed
per call, so both paths sample exactly the same tokens). Paths:

- direct: gRPC Actor.Generate with the prompt ids (what the gateway itself does per call, no recording);
- http:   OpenAI chat completions, non-streaming, to /s/<session>/v1 (a black-box agent);
- grpc:   gRPC Gateway.Chat (a white-box agent).

Reported per concurrency level: median over repeats of p50 and p99 latency, calls/s, and each path's ratio to direct.

``--case big-bodies`` measures instead whether one huge request stalls everyone: ``--senders`` processes each post
chat bodies of ``--body-mib`` MiB in a loop (one user message far over the context; the gateway refuses them with
context_length_exceeded), while one client times ``GET /health`` and small chat calls (1 new token) one after
another for ``--seconds``; the same probe runs first on the idle gateway. Reported: p50 / p99 of both, idle and
loaded side by side, the big bodies refused per second, the gateway's CPU and its peak and final resident memory,
and the same of its child processes (the one that decodes large bodies).

``--case hostile`` runs the same probe while ``--senders`` processes post small hostile requests in a loop, each
refused with a 400: schemas whose compilation would exhaust memory (``minItems: 1000000000``, as a response format
and as a strict tool), ``$ref`` cycles, huge pattern repetitions, values 600 levels deep, and a schema the grammar
sandbox has not seen (a new invalid type each time, so each one is compiled there).

Usage: python bench/gateway_latency.py [--concurrency 1 32 256] [--calls-per-session 4] [--max-tokens 8]
       [--repeats 3] [--paths direct http grpc] [--actor-threads 1] [--json]
       python bench/gateway_latency.py --case big-bodies [--senders 4] [--body-mib 16] [--seconds 20]
       python bench/gateway_latency.py --case hostile [--senders 4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import grpc
import numpy as np
from procfs import children, cpu_s, memory_kib

from forge.assets import TINY_DIR
from forge.launch import ServiceProcess
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2, gateway_pb2, gateway_pb2_grpc

TOK = Tokenizer.from_dir(TINY_DIR)


def messages_of(session: int) -> list[dict]:
    return [{"role": "user", "content": f"Session {session}: compute {session} + {session * 3}."}]


def sampling(seed: int, max_tokens: int) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)


async def run_direct(address: str, sessions: int, calls: int, max_tokens: int) -> list[float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)

        async def session(s: int) -> list[float]:
            prompt = TOK.apply_chat_template(messages_of(s), add_generation_prompt=True)
            took = []
            for c in range(calls):
                start = time.perf_counter()
                async for _chunk in stub.Generate(actor_pb2.GenerateRequest(prompt_ids=prompt,
                                                                            sampling=sampling(s * 1000 + c,
                                                                                              max_tokens))):
                    pass
                took.append(time.perf_counter() - start)
            return took

        return [t for ts in await asyncio.gather(*(session(s) for s in range(sessions))) for t in ts]


async def run_http(base: str, sessions: int, calls: int, max_tokens: int) -> list[float]:
    run = uuid.uuid4().hex[:8]
    connector = aiohttp.TCPConnector(limit=sessions + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:

        async def session(s: int) -> list[float]:
            url = f"{base}/s/bench-{run}-{s}/v1/chat/completions"
            took = []
            for c in range(calls):
                body = {"model": "forge-tiny", "messages": messages_of(s), "max_tokens": max_tokens,
                        "temperature": 1.0, "seed": s * 1000 + c, "ignore_eos": True}
                start = time.perf_counter()
                async with http.post(url, json=body) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
                took.append(time.perf_counter() - start)
            return took

        return [t for ts in await asyncio.gather(*(session(s) for s in range(sessions))) for t in ts]


async def run_grpc(address: str, sessions: int, calls: int, max_tokens: int) -> list[float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def session(s: int) -> list[float]:
            sid = (await stub.StartSession(gateway_pb2.StartSessionRequest(task_id="bench"))).session.session_id
            messages = [gateway_pb2.ChatMessage(**m) for m in messages_of(s)]
            took = []
            for c in range(calls):
                start = time.perf_counter()
                async for _chunk in stub.Chat(gateway_pb2.ChatRequest(session_id=sid, messages=messages,
                                                                      sampling=sampling(s * 1000 + c, max_tokens))):
                    pass
                took.append(time.perf_counter() - start)
            return took

        return [t for ts in await asyncio.gather(*(session(s) for s in range(sessions))) for t in ts]



def measure(path: str, targets: dict[str, str], sessions: int, calls: int, max_tokens: int,
            pids: dict[str, int]) -> dict[str, float]:
    runner = {"direct": run_direct, "http": run_http, "grpc": run_grpc}[path]
    cpu_before = {name: cpu_s(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    latencies = asyncio.run(runner(targets[path], sessions, calls, max_tokens))
    wall = time.perf_counter() - started
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
    figures = {"p50_ms": float(p50), "p99_ms": float(p99), "calls_per_s": len(latencies) / wall}
    for name, pid in pids.items():
        figures[f"{name}_cpu_ms_per_call"] = (cpu_s(pid) - cpu_before[name]) * 1e3 / len(latencies)
    return figures


def send_big_bodies(http_address: str, body_mib: int, stop: multiprocessing.synchronize.Event,
                    refused: multiprocessing.sharedctypes.Synchronized) -> None:
    """A client process: posts one huge chat body after another until ``stop``; counts the refusals."""
    envelope = json.dumps({"model": "forge-tiny", "messages": [{"role": "user", "content": ""}], "max_tokens": 1})
    words = (body_mib * 1024 * 1024 - len(envelope)) // 5
    body = json.dumps({"model": "forge-tiny", "messages": [{"role": "user", "content": "word " * words}],
                       "max_tokens": 1}).encode()
    host, port = http_address.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=600)
    while not stop.is_set():
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        if response.status != 400 or answer["error"]["code"] != "context_length_exceeded":
            raise RuntimeError(f"a big body got HTTP {response.status}: {answer}")
        with refused.get_lock():
            refused.value += 1


def hostile_bodies(i: int) -> list[dict]:
    """The hostile requests of round ``i``: each must be refused with a 400."""
    def formatted(schema: dict) -> dict:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}

    deep: object = "x"
    for _ in range(600):
        deep = {"a": deep}
    base = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    strict = {"tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                          "parameters": {"type": "array", "minItems": 10**9}}}],
              "tool_choice": {"type": "function", "function": {"name": "f"}}}
    return [{**base, **formatted({"type": "array", "minItems": 10**9})}, {**base, **strict},
            {**base, **formatted({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                  "$ref": "#/$defs/a"})},
            {**base, **formatted({"type": "string", "pattern": "^a{1000000000}$"})},
            {**base, "chat_template_kwargs": {"deep": deep}},
            {**base, **formatted({"type": "object", "properties": {f"k{i}": {"type": f"foo{i}"}}})}]


def send_hostile(http_address: str, stop: multiprocessing.synchronize.Event,
                 refused: multiprocessing.sharedctypes.Synchronized) -> None:
    """A client process: posts hostile requests until ``stop``; counts the refusals."""
    host, port = http_address.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=600)
    i = os.getpid() * 1_000_000
    while not stop.is_set():
        for body in hostile_bodies(i):
            connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            if response.status != 400:
                raise RuntimeError(f"a hostile request got HTTP {response.status}: {answer[:300]!r}")
            with refused.get_lock():
                refused.value += 1
        i += 1


async def probe(base: str, seconds: float) -> dict[str, list[float]]:
    """``GET /health`` and a small chat call, one after the other, for ``seconds``: their latencies."""
    took: dict[str, list[float]] = {"health": [], "chat": []}
    run = uuid.uuid4().hex[:8]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            start = time.perf_counter()
            async with http.get(f"{base}/health") as response:
                await response.read()
            took["health"].append(time.perf_counter() - start)
            body = {"model": "forge-tiny", "messages": messages_of(i), "max_tokens": 1, "seed": i}
            start = time.perf_counter()
            async with http.post(f"{base}/s/probe-{run}-{i}/v1/chat/completions", json=body) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"a small call got HTTP {response.status}: {await response.text()}")
            took["chat"].append(time.perf_counter() - start)
            i += 1
    return took




def memory_mib(pid: int) -> dict[str, float]:
    return {name: kib / 1024 for name, kib in memory_kib(pid).items()}


def under_load(args: argparse.Namespace, gateway_info: dict, gateway_pid: int) -> None:
    """The probe on the idle gateway, then beside ``--senders`` clients of ``--case``."""
    http_address = gateway_info["http_address"]
    asyncio.run(probe(http_address, 2))                                    # warm up
    idle = asyncio.run(probe(http_address, args.seconds))
    context = multiprocessing.get_context("spawn")
    stop, refused = context.Event(), context.Value("i", 0)
    sender, sent = ((send_big_bodies, (http_address, args.body_mib, stop, refused)) if args.case == "big-bodies"
                    else (send_hostile, (http_address, stop, refused)))
    senders = [context.Process(target=sender, args=sent) for _ in range(args.senders)]
    for sender in senders:
        sender.start()
    round_size = 1 if args.case == "big-bodies" else len(hostile_bodies(0))
    while refused.value < args.senders * round_size:                       # every sender is under way
        time.sleep(0.05)
    helpers = children(gateway_pid)
    counted_from, started = refused.value, time.perf_counter()
    cpu_before = {pid: cpu_s(pid) for pid in (gateway_pid, *helpers)}
    loaded = asyncio.run(probe(http_address, args.seconds))
    wall = time.perf_counter() - started
    rate, cpu_share = (refused.value - counted_from) / wall, (cpu_s(gateway_pid) - cpu_before[gateway_pid]) / wall
    helper_cpu = sum(cpu_s(pid) - cpu_before[pid] for pid in helpers) / wall
    helper_peak = sum(memory_mib(pid)["peak"] for pid in helpers)
    stop.set()
    for sender in senders:
        sender.join(timeout=120)
    memory = memory_mib(gateway_pid)
    if args.json:
        figures = {phase: {name: dict(zip(("p50_ms", "p99_ms"), np.percentile(ts, [50, 99]) * 1e3, strict=True))
                           for name, ts in took.items()} for phase, took in (("idle", idle), ("loaded", loaded))}
        print(json.dumps({"case": args.case, "senders": args.senders, "body_mib": args.body_mib, "refused_per_s": rate,
                          "gateway_cpu_cores": cpu_share, "gateway_memory_mib": memory,
                          "helper_cpu_cores": helper_cpu, "helper_peak_mib": helper_peak, "latency": figures},
                         indent=2))
        return
    what = f"{args.body_mib} MiB chat bodies" if args.case == "big-bodies" else "hostile requests"
    print(f"{args.senders} clients posting {what} in a loop ({rate:.1f} refused/s); "
          f"probe: GET /health and a 1-token chat call in turn for {args.seconds:.0f} s")
    print(f"{'call':>7} {'idle n':>7} {'p50 ms':>7} {'p99 ms':>7} {'loaded n':>9} {'p50 ms':>7} {'p99 ms':>7}")
    for name in ("health", "chat"):
        quiet, busy = np.percentile(idle[name], [50, 99]) * 1e3, np.percentile(loaded[name], [50, 99]) * 1e3
        print(f"{name:>7} {len(idle[name]):>7} {quiet[0]:>7.1f} {quiet[1]:>7.1f} {len(loaded[name]):>9} "
              f"{busy[0]:>7.1f} {busy[1]:>7.1f}")
    print(f"gateway while loaded: {cpu_share:.2f} cores of CPU; resident memory: peak {memory['peak']:.0f} MiB, "
          f"at the end {memory['now']:.0f} MiB")
    print(f"its {len(helpers)} child processes (decoding, grammar sandbox): {helper_cpu:.2f} cores of CPU, resident "
          f"memory peak {helper_peak:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["paths", "big-bodies", "hostile"], default="paths",
                        help="paths: the gateway against direct actor calls; big-bodies / hostile: /health and small "
                             "calls while clients post huge bodies / hostile requests")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--calls-per-session", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=["direct", "http", "grpc"], choices=["direct", "http", "grpc"])
    parser.add_argument("--actor-threads", type=int, default=1)
    parser.add_argument("--senders", type=int, default=4, help="big-bodies, hostile: client processes posting")
    parser.add_argument("--body-mib", type=int, default=16, help="big-bodies: size of each huge body")
    parser.add_argument("--seconds", type=float, default=20.0, help="big-bodies, hostile: how long each probe runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge-gateway-bench-"))
    actor = ServiceProcess("actor", "forge-actor", ["--port", "0", "--kv-cache-mb", "256", "--max-batch",
                                                    str(max(64, *args.concurrency)), "--threads",
                                                    str(args.actor_threads)], root)
    gateway = ServiceProcess("gateway", "forge-gateway", ["--actor", actor.info["address"], "--pool",
                                                          str(root / "pool"), "--grpc-port", "0", "--http-port", "0",
                                                          "--log-level", "WARNING"], root)
    actor_info, gateway_info = actor.info, gateway.info
    targets = {"direct": actor_info["address"], "http": gateway_info["http_address"],
               "grpc": gateway_info["grpc_address"]}
    pids = {"actor": actor.proc.pid, "gateway": gateway.proc.pid}
    results: dict[int, dict[str, dict[str, float]]] = {}
    if args.case in ("big-bodies", "hostile"):
        try:
            under_load(args, gateway_info, gateway.proc.pid)
        finally:
            gateway.stop()
            actor.stop()
        return
    try:
        for path in args.paths:                                    # warm up every path once
            measure(path, targets, 4, 2, args.max_tokens, pids)
        for sessions in args.concurrency:
            calls = max(args.calls_per_session, 64 // sessions) if sessions < 64 else args.calls_per_session
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in args.paths}
            for _ in range(args.repeats):
                for path in args.paths:                            # interleaved, so drift hits every path alike
                    runs[path].append(measure(path, targets, sessions, calls, args.max_tokens, pids))
            results[sessions] = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                                 for p, rs in runs.items()}
    finally:
        gateway.stop()
        actor.stop()
    if args.json:
        print(json.dumps({"max_tokens": args.max_tokens, "results": results}, indent=2))
        return
    print(f"max_tokens={args.max_tokens}, medians of {args.repeats} runs; ratios are path / direct; CPU: ms of "
          "each process per call")
    print(f"{'sessions':>8} {'path':>6} {'p50 ms':>9} {'p99 ms':>9} {'calls/s':>9} {'+p50 ms':>8} {'+p99 ms':>8} "
          f"{'p50 x':>6} {'calls/s x':>9} {'gw CPU':>7} {'actor CPU':>9}")
    for sessions, paths in results.items():
        base = paths.get("direct")
        for path, r in paths.items():
            extra = ("", "", "", "")
            if base and path != "direct":
                extra = (f"{r['p50_ms'] - base['p50_ms']:+.1f}", f"{r['p99_ms'] - base['p99_ms']:+.1f}",
                         f"{r['p50_ms'] / base['p50_ms']:.2f}", f"{r['calls_per_s'] / base['calls_per_s']:.2f}")
            print(f"{sessions:>8} {path:>6} {r['p50_ms']:>9.1f} {r['p99_ms']:>9.1f} {r['calls_per_s']:>9.1f} "
                  f"{extra[0]:>8} {extra[1]:>8} {extra[2]:>6} {extra[3]:>9} {r['gateway_cpu_ms_per_call']:>7.2f} "
                  f"{r['actor_cpu_ms_per_call']:>9.2f}")


if __name__ == "__main__":
    main()
