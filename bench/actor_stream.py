"""Decode tokens/s of a real ``forge-actor`` process over gRPC, with B concurrent Generate streams, for several
actor settings side by side: the engine loop in a thread of the server (``--in-process``) or in a process of its
own (the default), and one message per token (``--stream-interval 1``) or fewer, larger ones (0 = adaptive, the
default). Each message costs the server CPU time under its GIL, which an in-process engine loop needs too, so
at large batches the message rate, not the model, can bound such a server. The same requests straight into a
``TorchEngine`` (no server, in a fresh process) show what a server could reach. Also printed: the actors' CPU time
(server process and engine core, from /proc), the server's CPU per streamed message, and the time to first token.

Usage: python bench/actor_stream.py [--batches 8,32,64] [--new-tokens 128] [--repeats 3]
                                    [--configs thread:1,thread:0,process:1,process:0] [--max-batch 64]
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
import grpc
from decode_inputs import prompt_ids

from forge.launch import ServiceProcess
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2


def engine_alone(batches: list[int], new_tokens: int, repeats: int, threads: int,
                 max_batch: int) -> dict[int, tuple[float, float]]:
    """The same requests straight into a TorchEngine (no server): what the servers could reach. Run in a fresh
    process (see main)."""
    from forge.actors.backend import GenerationRequest
    from forge.actors.config import EngineConfig
    from forge.actors.engine.cpu_threads import reserve_cpu_threads
    from forge.actors.engine.engine import TorchEngine
    from forge.actors.engine.policy import load_policy
    from forge.sampling.params import SamplingParams

    threads = reserve_cpu_threads(threads)
    model, model_id = load_policy("tiny", "cpu", "float32")
    engine = TorchEngine(model, EngineConfig(kv_cache_bytes=256 * 2**20, speculative=False, threads=threads,
                                             model_id=model_id, max_num_seqs=max_batch))

    def run(batch: int, tokens: int) -> tuple[float, float]:
        started = time.perf_counter()
        streams = [engine.submit(GenerationRequest("", prompt_ids(i, 32), SamplingParams(
            temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=i))) for i in range(batch)]
        chunks = [list(stream) for stream in streams]
        elapsed = time.perf_counter() - started
        return sum(len(c.token_ids) for each in chunks for c in each) / elapsed, sum(map(len, chunks)) / batch

    try:
        run(2, 8)
        results = {}
        for batch in batches:
            runs = [run(batch, new_tokens) for _ in range(repeats)]
            results[batch] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        return results
    finally:
        engine.close()


@dataclass
class Served:
    """One actor setting at one batch size: medians over the runs, and the actor's CPU over all of them."""

    tokens_per_s: float
    messages: float                 # per request
    first_token_s: float            # median over the batch's streams
    slowest_first_token_s: float
    server_cpu: float               # CPU seconds per wall second: the server process
    core_cpu: float                 # ... and the engine core (0 with the engine in process)
    server_cpu_per_message: float   # seconds


def serve_and_measure(run_dir: Path, config: str, batches: list[int], new_tokens: int, repeats: int,
                      threads: int, max_batch: int) -> dict[int, Served]:
    """Each batch size's figures against one actor started for ``config`` (ENGINE:INTERVAL)."""
    engine, interval = config.split(":")
    actor = ServiceProcess(f"actor-{engine}-{interval}", "forge-actor", [
        "--model", "tiny", "--port", "0", "--threads", str(threads), "--no-speculative", "--kv-cache-mb", "256",
        "--max-batch", str(max_batch),
        "--stream-interval", interval, "--engine-process" if engine == "process" else "--in-process"], run_dir,
        timeout_s=120)
    try:
        with grpc.insecure_channel(actor.info["address"]) as channel:
            stub = actor_pb2_grpc.ActorStub(channel)
            generate_all(stub, 2, 8)                                    # warm-up
            results = {}
            for batch in batches:
                before, started = cpu_seconds(actor.proc.pid), time.perf_counter()
                runs = [generate_all(stub, batch, new_tokens) for _ in range(repeats)]
                wall, after = time.perf_counter() - started, cpu_seconds(actor.proc.pid)
                medians = [statistics.median(figures) for figures in zip(*runs, strict=True)]
                server, core = after[0] - before[0], after[1] - before[1]
                results[batch] = Served(*medians, server / wall, core / wall,
                                        server / sum(r[1] * batch for r in runs))
            return results
    finally:
        actor.stop()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by process ``pid`` and by its children (the engine core), from /proc (Linux)."""
    def used(process: int) -> float:
        fields = Path(f"/proc/{process}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return used(pid), sum(used(int(child)) for child in children)


def generate_all(stub: actor_pb2_grpc.ActorStub, batch: int, new_tokens: int) -> tuple[float, float, float, float]:
    """``batch`` concurrent streams of ``new_tokens`` sampled tokens each: (tokens/s, messages per request, median
    and slowest time to first token in seconds)."""
    tokens, messages, first = [0] * batch, [0] * batch, [0.0] * batch

    def one(index: int) -> None:
        request = actor_pb2.GenerateRequest(
            prompt_ids=prompt_ids(index, 32),
            sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=index))
        for chunk in stub.Generate(request, timeout=300):
            if not tokens[index] and chunk.token_ids:
                first[index] = time.perf_counter() - started
            tokens[index] += len(chunk.token_ids)
            messages[index] += 1

    workers = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if sum(tokens) != batch * new_tokens:
        raise RuntimeError(f"expected {batch * new_tokens} tokens, got {sum(tokens)}")
    return sum(tokens) / elapsed, sum(messages) / batch, statistics.median(first), max(first)


@click.command()
@click.option("--batches", default="8,32,64", show_default=True)
@click.option("--new-tokens", default=128, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--configs", default="thread:1,thread:0,process:1,process:0", show_default=True,
              help="ENGINE:INTERVAL pairs, ENGINE = thread (--in-process) or process (the engine core), INTERVAL = "
                   "--stream-interval (0 = adaptive); the first is the baseline of the ratios.")
@click.option("--threads", default=1, show_default=True, help="torch threads of each actor's engine loop")
@click.option("--max-batch", default=64, show_default=True,
              help="Sequences each engine decodes together (forge-actor --max-batch); batches beyond it queue.")
def main(batches: str, new_tokens: int, repeats: int, configs: str, threads: int, max_batch: int) -> None:
    sizes = [int(b) for b in batches.split(",")]
    settings = configs.split(",")
    for config in settings:
        engine, _, interval = config.partition(":")
        if engine not in ("thread", "process") or not interval.isdigit():
            raise click.BadParameter(f"{config!r} is not ENGINE:INTERVAL (thread:1, process:0, ...)")
    with tempfile.TemporaryDirectory() as directory:
        results = {config: serve_and_measure(Path(directory), config, sizes, new_tokens, repeats, threads, max_batch)
                   for config in settings}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        alone = pool.submit(engine_alone, sizes, new_tokens, repeats, threads, max_batch).result()

    def name(config: str) -> str:
        engine, interval = config.split(":")
        return f"{engine}, " + ("adaptive" if interval == "0" else f"every {interval}")

    base_name = name(settings[0])
    print(f"\n## forge-actor over gRPC: tokens/s (messages per request), {new_tokens} new tokens, medians of {repeats}")
    columns = [*map(name, settings), "engine alone, adaptive", *(f"{name(c)} / {base_name}" for c in settings[1:]),
               *(f"{name(c)} / engine alone" for c in settings)]

    def row(batch: int) -> list[str]:
        served, (engine, engine_messages) = [results[c][batch] for c in settings], alone[batch]
        return [*(f"{s.tokens_per_s:,.0f} ({s.messages:.0f})" for s in served), f"{engine:,.0f} ({engine_messages:.0f})",
                *(f"{s.tokens_per_s / served[0].tokens_per_s:.2f}x" for s in served[1:]),
                *(f"{s.tokens_per_s / engine:.2f}" for s in served)]

    print_table(columns, {batch: row(batch) for batch in sizes})
    print("\nCPU seconds per wall second over each batch's runs (server process / engine core; 1.0 = one core busy):")
    print_table(list(map(name, settings)), {batch: [
        f"{s.server_cpu:.2f} / {s.core_cpu:.2f}" if s.core_cpu else f"{s.server_cpu:.2f}"
        for s in (results[c][batch] for c in settings)] for batch in sizes})
    print("\nTime to first token over the batch's streams, ms (median / slowest; medians of the runs):")
    print_table(list(map(name, settings)), {batch: [
        f"{s.first_token_s * 1e3:,.0f} / {s.slowest_first_token_s * 1e3:,.0f}"
        for s in (results[c][batch] for c in settings)] for batch in sizes})
    separate = [c for c in settings if c.startswith("process")]
    if separate:
        print("\nServer process CPU per streamed message, engine core apart (µs; the gRPC server's cost):")
        print_table(list(map(name, separate)), {batch: [f"{results[c][batch].server_cpu_per_message * 1e6:.0f}"
                                                        for c in separate] for batch in sizes})


def print_table(columns: list[str], rows: dict[int, list[str]]) -> None:
    """A markdown table with a batch column first."""
    print("| batch | " + " | ".join(columns) + " |")
    print("| ---: |" + " ---: |" * len(columns))
    for batch, cells in rows.items():
        print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
