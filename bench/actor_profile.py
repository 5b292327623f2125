"""Where the torch engine's decode step spends its time:

1. cProfile of ``TorchEngine._step`` while it decodes a batch, grouped into the model's torch kernels, the rest of
   the model forward (Python module overhead), and the engine's own scheduling and bookkeeping;
2. without a profiler: the median CPU time of the loop thread per decode step and per forward pass, and the
   median decode tokens/s of whole runs, eager and in graph mode (``compile_decode``), the two engines run
   alternately in one process;
3. the floor: the step's matrix multiplications alone.

Usage: python bench/actor_profile.py [--model tiny|DIR] [--batch 32] [--new-tokens 128] [--threads 1]
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import click
import torch
from actor_decode import matmul_floor, model_reference
from decode_inputs import load, prompt_ids

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.sampling.params import SamplingParams

KERNELS = ("linear", "scaled_dot_product_attention", "index_select", "rms_norm", "index_copy_", "cat", "embedding",
           "silu", "mul", "add", "softmax", "multinomial", "exponential_", "argmax", "log_softmax", "topk", "sort")


@click.command()
@click.option("--model", default="tiny", show_default=True, callback=model_reference)
@click.option("--batch", default=32, show_default=True)
@click.option("--new-tokens", default=128, show_default=True)
@click.option("--threads", default=1, show_default=True)
def main(model: str, batch: int, new_tokens: int, threads: int) -> None:
    torch.set_num_threads(threads)
    engine = TorchEngine(load(model), EngineConfig(kv_cache_bytes=256 * 2**20, speculative=False))
    profile, step = cProfile.Profile(), engine._step

    def profiled_step() -> None:
        profile.enable()
        try:
            step()
        finally:
            profile.disable()

    engine._step = profiled_step
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, ignore_eos=True) for i in range(batch)]
    prompts = [prompt_ids(i, 32) for i in range(batch)]
    started = time.perf_counter()
    streams = [engine.submit(GenerationRequest("", p, s)) for p, s in zip(prompts, params, strict=True)]
    produced = sum(len(c.token_ids) for stream in streams for c in stream)
    elapsed = time.perf_counter() - started
    engine.close()
    stats = pstats.Stats(profile).stats
    total = sum(ct for (_, _, name), (_, _, _, ct, _) in stats.items() if name == "_step") or 1e-9
    steps = next(c for (_, _, name), (c, _, _, _, _) in stats.items() if name == "_step")
    kernels = sum(tt for (_, _, name), (_, _, tt, _, _) in stats.items()
                  if name.startswith(("<built-in method", "<method")) and any(k in name for k in KERNELS))
    forward = sum(ct for (path, _, name), (_, _, _, ct, _) in stats.items()
                  if path.endswith("runner.py") and name == "run")
    print(f"batch {batch}, {threads} thread(s): {produced / elapsed:,.0f} tok/s, {steps} steps, "
          f"{1e3 * total / steps:.2f} ms per step (profiled)")
    print(f"| part | share of the step |\n| --- | ---: |\n| torch kernels of the model | {kernels / total:.0%} |")
    print(f"| rest of the model forward (Python modules, layout) | {(forward - kernels) / total:.0%} |")
    print(f"| engine scheduling, sampling bookkeeping, streaming | {(total - forward) / total:.0%} |")
    split = step_split(model, batch, new_tokens, threads)
    print("\n| decode step (loop thread CPU time, medians) | step | forward | rest of the step | tokens/s (wall) |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for mode, (step_s, forward_s, rate) in split.items():
        print(f"| {mode} | {1e3 * step_s:.2f} ms | {1e3 * forward_s:.2f} ms | {1e3 * (step_s - forward_s):.2f} ms | "
              f"{rate:,.0f} |")
    floor = matmul_floor(engine.model, batch)
    print(f"the step's matrix multiplications alone (no profiler): {1e3 * floor:.2f} ms; any fp32 decode step at "
          f"batch {batch} on this core costs at least that, so a baseline step of T ms allows at most T / "
          f"{1e3 * floor:.2f} x")


def step_split(model_name: str, batch: int, new_tokens: int, threads: int,
               rounds: int = 5) -> dict[str, tuple[float, float, float]]:
    """Median loop-thread CPU seconds per decode step and per forward pass, and median tokens/s of a round, eager
    and in graph mode: one engine of each (each with its own copy of the model, so that timing the eager forward
    never reaches the compiled one), decoding the same batch alternately, after a warm-up that compiles the
    graph."""
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, ignore_eos=True) for i in range(batch)]
    prompts = [prompt_ids(i, 32) for i in range(batch)]
    engines, times, rates = {}, {}, {}
    for mode in ("eager", "graph mode"):
        engine = TorchEngine(load(model_name), EngineConfig(kv_cache_bytes=256 * 2**20, speculative=False,
                                                            compile_decode=mode != "eager", threads=threads))
        steps, forwards = [], []
        _time_calls(engine, "_step", steps)
        if engine.runner.compiled is not None:
            _time_calls(engine.runner, "compiled", forwards)
        else:
            _time_calls(engine.runner.model, "forward", forwards)
        engines[mode], times[mode], rates[mode] = engine, (steps, forwards), []
    try:
        for round_ in range(rounds + 1):
            for mode, engine in engines.items():
                started = time.perf_counter()
                streams = [engine.submit(GenerationRequest("", p, s)) for p, s in zip(prompts, params, strict=True)]
                for stream in streams:
                    stream.finished.wait()
                rates[mode].append(batch * new_tokens / (time.perf_counter() - started))
                if round_ == 0:                                 # warm-up (and the compile)
                    rates[mode].clear()
                    for samples in times[mode]:
                        samples.clear()
    finally:
        for engine in engines.values():
            engine.close()
    return {mode: (statistics.median(steps), statistics.median(forwards), statistics.median(rates[mode]))
            for mode, (steps, forwards) in times.items()}


def _time_calls(owner, name: str, samples: list[float]) -> None:
    call = getattr(owner, name)

    def timed(*args, **kwargs):
        started = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            samples.append(time.thread_time() - started)

    setattr(owner, name, timed)


if __name__ == "__main__":
    main()
