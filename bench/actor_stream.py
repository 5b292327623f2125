"""Decode tokens/s of a real ``forge-actor`` process over gRPC, with B concurrent Generate streams, for several
``--stream-interval`` settings side by side: one message per token against fewer, larger messages (0 = adaptive,
the default). Each message costs a handler thread of the actor tens of microseconds under the GIL that the engine
loop needs too, so at large batches the message rate, not the model, can bound the server.

Usage: python bench/actor_stream.py [--batches 8,32,64] [--new-tokens 128] [--repeats 3] [--intervals 1,0]
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

import click
import grpc

from forge.launch import ServiceProcess
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2


def serve_and_measure(run_dir: Path, interval: int, batches: list[int], new_tokens: int, repeats: int,
                      threads: int) -> dict[int, tuple[float, float]]:
    """Median tokens/s and messages per request at each batch size, against one actor started for ``interval``."""
    actor = ServiceProcess(f"actor-{interval}", "forge-actor", [
        "--model", "tiny", "--port", "0", "--threads", str(threads), "--no-speculative", "--kv-cache-mb", "256",
        "--stream-interval", str(interval)], run_dir, timeout_s=120)
    try:
        with grpc.insecure_channel(actor.info["address"]) as channel:
            stub = actor_pb2_grpc.ActorStub(channel)
            generate_all(stub, 2, 8)                                    # warm-up
            results = {}
            for batch in batches:
                runs = [generate_all(stub, batch, new_tokens) for _ in range(repeats)]
                results[batch] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
            return results
    finally:
        actor.stop()


def generate_all(stub: actor_pb2_grpc.ActorStub, batch: int, new_tokens: int) -> tuple[float, float]:
    """``batch`` concurrent streams of ``new_tokens`` sampled tokens each: (tokens/s, messages per request)."""
    tokens, messages = [0] * batch, [0] * batch

    def one(index: int) -> None:
        request = actor_pb2.GenerateRequest(
            prompt_ids=[(7 * index + j) % 1000 + 1 for j in range(32)],
            sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=index))
        for chunk in stub.Generate(request, timeout=300):
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
    return sum(tokens) / elapsed, sum(messages) / batch


@click.command()
@click.option("--batches", default="8,32,64", show_default=True)
@click.option("--new-tokens", default=128, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--intervals", default="1,0", show_default=True, help="--stream-interval values; the first is the "
              "baseline of the ratios (0 = adaptive).")
@click.option("--threads", default=1, show_default=True, help="torch threads of each actor's engine loop")
def main(batches: str, new_tokens: int, repeats: int, intervals: str, threads: int) -> None:
    sizes = [int(b) for b in batches.split(",")]
    settings = [int(i) for i in intervals.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        results = {interval: serve_and_measure(Path(directory), interval, sizes, new_tokens, repeats, threads)
                   for interval in settings}
    names = {interval: "adaptive" if interval == 0 else f"every {interval}" for interval in settings}
    print(f"\n## forge-actor over gRPC: tokens/s (messages per request), {new_tokens} new tokens, medians of {repeats}")
    print("| batch | " + " | ".join(names[i] for i in settings) + " | " +
          " | ".join(f"{names[i]} / {names[settings[0]]}" for i in settings[1:]) + " |")
    print("| ---: |" + " ---: |" * (2 * len(settings) - 1))
    for batch in sizes:
        base = results[settings[0]][batch][0]
        cells = [f"{results[i][batch][0]:,.0f} ({results[i][batch][1]:.0f})" for i in settings]
        ratios = [f"{results[i][batch][0] / base:.2f}x" for i in settings[1:]]
        print(f"| {batch} | " + " | ".join(cells + ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
