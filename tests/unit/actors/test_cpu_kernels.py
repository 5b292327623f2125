"""The compiled CPU attention kernel: equal to the gather + masked SDPA path on random paged caches (shuffled block
tables, uneven lengths, several queries per row, GQA groups, head sizes off the vector width, the MTP layer's
shifted key range), and a clean fallback where it cannot be built."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from forge.actors.engine import cpu_kernels

needs_compiler = pytest.mark.skipif(not cpu_kernels.compiler_present(), reason="no C compiler on this machine")


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """A kernel built from scratch into an empty cache folder."""
    monkeypatch.setenv("FORGE_KERNEL_DIR", str(tmp_path))
    cpu_kernels.load.cache_clear()
    yield tmp_path
    cpu_kernels.load.cache_clear()


def reference(q, key_cache, value_cache, tables, query_slots, key_lower, scale):
    batch, _, _, dim = q.shape
    _, block_size, kv_heads, _ = key_cache.shape
    keys = key_cache.index_select(0, tables.reshape(-1)).view(batch, -1, kv_heads, dim).transpose(1, 2)
    values = value_cache.index_select(0, tables.reshape(-1)).view(batch, -1, kv_heads, dim).transpose(1, 2)
    positions = torch.arange(tables.shape[1] * block_size)
    mask = (positions <= query_slots.unsqueeze(-1)) & (positions >= key_lower)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.unsqueeze(1), scale=scale,
                                          enable_gqa=q.shape[1] != kv_heads)


@needs_compiler
@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 2, 32), (4, 4, 16), (8, 2, 20), (2, 1, 64), (8, 1, 32),
                                                   (12, 3, 32), (8, 2, 64), (16, 4, 128), (6, 2, 48)])
@pytest.mark.parametrize("length, key_lower, block_size", [(1, 0, 16), (2, 0, 8), (3, 1, 16)])
def test_the_kernel_equals_gathered_sdpa_on_random_paged_caches(fresh_build, heads, kv_heads, dim, length,
                                                               key_lower, block_size):
    library = cpu_kernels.load()
    assert library is not None and any(fresh_build.glob("*.so"))
    generator = torch.Generator().manual_seed(heads * 100 + dim + length)
    num_blocks, batch, max_blocks = 64, 6, 7
    key_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=generator) * 2
    value_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=generator)
    tables = torch.stack([torch.randperm(num_blocks, generator=generator)[:max_blocks] for _ in range(batch)])
    # uneven rows: the last query of a row sees anything from one key past key_lower to the whole table
    last = torch.randint(key_lower + length, max_blocks * block_size, (batch,), generator=generator)
    last[0] = key_lower + length - 1
    query_slots = last.unsqueeze(-1) - torch.arange(length - 1, -1, -1)
    q = torch.randn(batch, heads, length, dim, generator=generator)
    scale = dim**-0.5
    got = cpu_kernels.paged_attention(library, q, key_cache, value_cache, tables, query_slots, key_lower, scale)
    torch.testing.assert_close(got, reference(q, key_cache, value_cache, tables, query_slots, key_lower, scale),
                               atol=2e-6, rtol=1e-5)


@needs_compiler
def test_the_kernel_rejects_what_it_cannot_run(fresh_build):
    library = cpu_kernels.load()
    cache = torch.zeros(4, 8, 2, 16)
    tables = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="fp32"):
        cpu_kernels.paged_attention(library, torch.zeros(1, 4, 1, 16, dtype=torch.float64), cache, cache, tables,
                                    torch.zeros(1, 1, dtype=torch.long), 0, 1.0)
    with pytest.raises(RuntimeError, match="no key"):
        cpu_kernels.paged_attention(library, torch.zeros(1, 4, 1, 16), cache, cache, tables,
                                    torch.zeros(1, 1, dtype=torch.long), 1, 1.0)


def test_without_a_compiler_the_engine_falls_back_to_torch_attention(fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="forge.actors.engine.cpu_kernels"):
        assert not cpu_kernels.compiler_present() and cpu_kernels.load() is None
    assert "no C compiler" in caplog.text
    monkeypatch.delenv("CC")
    monkeypatch.setenv("FORGE_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    assert cpu_kernels.load() is None and not any(fresh_build.glob("*.so"))


@needs_compiler
def test_a_failing_build_is_reported_and_falls_back(fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")          # a "compiler" that exits with an error
    with caplog.at_level(logging.WARNING, logger="forge.actors.engine.cpu_kernels"):
        assert cpu_kernels.load() is None
    assert "could not build" in caplog.text


@needs_compiler
def test_the_parallel_kernel_shares_torch_openmp_runtime_and_matches(fresh_build):
    """Large enough to split over threads: equal results with 1 and 2 threads, and no second OpenMP runtime."""
    library = cpu_kernels.load()
    generator = torch.Generator().manual_seed(5)
    key_cache, value_cache = torch.randn(2, 300, 16, 2, 32, generator=generator)
    tables = torch.stack([torch.randperm(300, generator=generator)[:40] for _ in range(24)])
    query_slots = torch.randint(0, 40 * 16, (24, 2), generator=generator)
    q = torch.randn(24, 4, 2, 32, generator=generator)
    before = torch.get_num_threads()
    try:
        outputs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outputs.append(cpu_kernels.paged_attention(library, q, key_cache, value_cache, tables, query_slots, 0,
                                                       0.2))
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(outputs[0], outputs[1], atol=0, rtol=0)
    torch.testing.assert_close(outputs[0], reference(q, key_cache, value_cache, tables, query_slots, 0, 0.2),
                               atol=2e-6, rtol=1e-5)
    maps = Path("/proc/self/maps")
    if maps.exists():
        runtimes = {line.split()[-1] for line in maps.read_text().splitlines() if line.endswith("/libgomp.so.1")}
        assert len(runtimes) <= 1, runtimes
