"""Section 6 of ``bench/actor_decode.py`` (``--sections vllm``, in an environment with vLLM: ``make test-vllm`` makes
one): the torch engine against vLLM's CPU build on the same checkpoint, each side in a fresh process: decode tokens/s
and tokens per CPU-second at each batch, and the pause a weight swap causes in each."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from decode_inputs import in_fresh_process, load, median, prompt_ids

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.cpu_threads import reserve_cpu_threads
from forge.actors.engine.engine import TorchEngine
from forge.sampling.params import SamplingParams


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and all its descendants so far (Linux /proc): vLLM's engine core
    and worker run in processes of their own."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        todo += children.get(current, [])
    return total


def backend_seconds(backend, batch: int, prompt_len: int, new_tokens: int) -> float:
    """``engine_seconds`` for any backend already running."""
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, ignore_eos=True) for i in range(batch)]
    started = time.perf_counter()
    streams = [backend.submit(GenerationRequest("", prompt_ids(i, prompt_len), p)) for i, p in enumerate(params)]
    produced = sum(len(c.token_ids) for stream in streams for c in stream)
    assert produced == batch * new_tokens, produced
    return time.perf_counter() - started


def start_backend(side: str, model_name: str, threads: int):
    """The torch engine or vLLM on ``model_name`` (CPU, fp32, prefix caching off so repeats recompute; a message
    per step, so that arrivals time steps)."""
    config = EngineConfig(kv_cache_bytes=256 * 2**20, threads=threads, prefix_caching=False, speculative=False,
                          stream_interval=1)
    if side == "vllm":
        from forge.actors.vllm.backend import VllmBackend
        from forge.checkpoints import resolve_model

        return VllmBackend(resolve_model(model_name), config, kv_events=False)
    return TorchEngine(load(model_name).eval(), config)


def measure_backend(side: str, model_name: str, threads: int, batches: list[int], new_tokens: int,
                    repeats: int) -> dict[int, tuple[float, float]]:
    """Per batch: median decode tokens/s and tokens per CPU-second (the process tree's CPU time) of one backend,
    in this (fresh) process."""
    import os

    threads = reserve_cpu_threads(threads) if side == "engine" else threads
    backend = start_backend(side, model_name, threads)
    try:
        backend_seconds(backend, 2, 32, 8)                     # warm-up
        figures = {}
        for batch in batches:
            rates, per_cpu = [], []
            for _ in range(repeats):
                cpu = tree_cpu_seconds(os.getpid())
                seconds = backend_seconds(backend, batch, 32, new_tokens)
                cpu = tree_cpu_seconds(os.getpid()) - cpu
                rates.append(batch * new_tokens / seconds)
                per_cpu.append(batch * new_tokens / cpu)
            figures[batch] = (median(rates), median(per_cpu))
        return figures
    finally:
        backend.close()


def swap_pause_ms(side: str, model_name: str, threads: int, swaps: int = 5) -> tuple[float, float]:
    """(median step gap, median pause a swap adds) in ms while 8 requests decode, for one backend."""
    threads = reserve_cpu_threads(threads) if side == "engine" else threads
    backend = start_backend(side, model_name, threads)
    state = {k: v.clone() for k, v in load(model_name).state_dict().items()}
    try:
        streams = [backend.submit(GenerationRequest("", [1, 2, 3], SamplingParams(seed=i, max_tokens=1500,
                                                                                   ignore_eos=True)))
                   for i in range(8)]
        arrivals: list[tuple[float, int]] = []
        for version in range(1, swaps + 2):
            for _ in range(40):
                chunk = streams[0].get(timeout=120)
                arrivals.append((time.perf_counter(), chunk.weight_versions[0] if chunk.weight_versions else -1))
            if version <= swaps:
                backend.load_weights(version, state)
        for stream in streams:
            backend.abort(stream.request_id)
    finally:
        backend.close()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    swap_gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals) if b[1] != a[1]]
    return 1e3 * median(gaps), 1e3 * (median(swap_gaps) - median(gaps))


def vllm_section(model_name: str, threads: int, batches: list[int], new_tokens: int, repeats: int) -> None:
    """The torch engine against vLLM (its CPU build) on the same checkpoint, each in a fresh process."""
    threads = threads or 1
    print(f"\n## Torch engine against vLLM (sampling, 32-token prompts, {new_tokens} new tokens, {threads} thread(s) "
          "each, fp32; each side in a fresh process)")
    print("Tokens per CPU-second count the CPU time of each side's whole process tree (vLLM's engine core and worker "
          "run in processes of their own).")
    print("| batch | engine tok/s | vLLM tok/s | engine / vLLM | engine tok/CPU-s | vLLM tok/CPU-s | engine / vLLM "
          "per CPU-s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ours = in_fresh_process(measure_backend, "engine", model_name, threads, batches, new_tokens, repeats)
    theirs = in_fresh_process(measure_backend, "vllm", model_name, threads, batches, new_tokens, repeats)
    for batch in batches:
        (rate, per_cpu), (vrate, vper_cpu) = ours[batch], theirs[batch]
        print(f"| {batch} | {rate:,.0f} | {vrate:,.0f} | {rate / vrate:.2f}x | {per_cpu:,.0f} | {vper_cpu:,.0f} | "
              f"{per_cpu / vper_cpu:.2f}x |", flush=True)
    (gap, pause), (vgap, vpause) = (in_fresh_process(swap_pause_ms, side, model_name, threads)
                                    for side in ("engine", "vllm"))
    print(f"\nWeight swap pause (batch 8 decoding, 5 swaps, median): engine {pause:.1f} ms (step {gap:.1f} ms), "
          f"vLLM {vpause:.1f} ms (step {vgap:.1f} ms)")
