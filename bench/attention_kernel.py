"""The CPU decode-attention kernel against torch's gather + masked SDPA path, side by side in one run: one layer of
a decode step (one query per row) over a paged cache whose blocks are scattered, at a short and a long context.

Usage: python bench/attention_kernel.py [--batch 32] [--contexts 96,1100] [--threads 1] [--repeats 200]
"""

from __future__ import annotations

import functools
import statistics
import time

import click
import torch

from forge.actors.engine import cpu_kernels
from forge.actors.engine.paged_attention import PagedAttention, PagedKVCache, StepLayout


def median_us(fn, repeats: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


@click.command()
@click.option("--batch", default=32, show_default=True)
@click.option("--contexts", default="96,1100", show_default=True, help="Keys each query sees.")
@click.option("--heads", default=4, show_default=True)
@click.option("--kv-heads", default=2, show_default=True)
@click.option("--head-dim", default=32, show_default=True)
@click.option("--threads", default=1, show_default=True)
@click.option("--repeats", default=200, show_default=True)
def main(batch: int, contexts: str, heads: int, kv_heads: int, head_dim: int, threads: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    kernel = cpu_kernels.load()
    if kernel is None:
        raise click.ClickException("the CPU kernel could not be built here (see the warning above)")
    generator = torch.Generator().manual_seed(0)
    block_size = 16
    print(f"batch {batch}, {heads} query / {kv_heads} KV heads of {head_dim}, {threads} thread(s), medians of "
          f"{repeats}")
    print("| keys per query | gather + SDPA µs | C kernel µs | speed-up | kernel GB/s of keys and values |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for context in (int(c) for c in contexts.split(",")):
        per_row = -(-context // block_size)
        num_blocks = 4 * batch * per_row          # a cache larger than one layer's blocks, as in a server
        cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, torch.float32, "cpu")
        cache.keys.normal_(generator=generator)
        cache.values.normal_(generator=generator)
        tables = torch.randperm(num_blocks, generator=generator)[:batch * per_row].view(batch, per_row)
        layout = StepLayout(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), tables,
                            torch.full((batch, 1), context - 1), 0, block_size)
        q = torch.randn(batch, heads, 1, head_dim, generator=generator)
        kv = torch.empty(batch, kv_heads, 1, head_dim)     # nothing to write: write_rows is empty
        sides = {name: PagedAttention(cache, layout, kernel if name == "kernel" else None)
                 for name in ("torch", "kernel")}
        torch.testing.assert_close(sides["kernel"].attend(0, q, kv, kv, head_dim**-0.5),
                                   sides["torch"].attend(0, q, kv, kv, head_dim**-0.5), atol=2e-6, rtol=1e-5)
        us = {name: median_us(functools.partial(side.attend, 0, q, kv, kv, head_dim**-0.5), repeats)
              for name, side in sides.items()}
        gigabytes = 2 * batch * context * kv_heads * head_dim * 4 / 1e9
        print(f"| {context:,} | {us['torch']:,.0f} | {us['kernel']:,.0f} | {us['torch'] / us['kernel']:.2f}x | "
              f"{gigabytes / (us['kernel'] / 1e6):.1f} |", flush=True)


if __name__ == "__main__":
    main()
