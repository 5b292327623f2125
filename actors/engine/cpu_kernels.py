"""Compiled CPU kernels of the torch engine, built on first use with the system's C compiler and loaded by ctypes.

Plain C with no torch headers: it compiles in a fraction of a second (a torch C++ extension takes a minute) and
is called on raw tensor pointers. The shared object is cached under ``$FORGE_KERNEL_DIR`` (default
``~/.cache/forge/kernels``), keyed by the source, the compiler and its flags, and this CPU, so a machine never
loads code built for another. Where no compiler is found, or ``FORGE_CPU_KERNELS=0``, ``load`` returns None and
the engine keeps its pure-torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from forge import variables

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.c"
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-shared", "-fPIC")


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


def _flags() -> tuple[str, ...]:
    """Build with OpenMP only where torch runs on GNU OpenMP: the kernel then links libgomp.so.1, which resolves to
    the copy torch has loaded (one thread pool). Elsewhere a second OpenMP runtime would compete with torch's for
    the cores, so the kernel is built serial."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return FLAGS
    gnu_openmp = any(line.endswith("/libgomp.so.1") for line in maps.splitlines())
    return (*FLAGS, "-fopenmp") if gnu_openmp else FLAGS


def _cache_dir() -> Path:
    if variables.is_set("FORGE_KERNEL_DIR"):
        return Path(variables.read("FORGE_KERNEL_DIR"))
    return Path(variables.read("XDG_CACHE_HOME") or Path.home() / ".cache") / "forge" / "kernels"


def _build(compiler: str, flags: tuple[str, ...], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built), "-lm"], check=True, capture_output=True,
                       text=True, timeout=120)
        os.replace(built, target)              # atomic: concurrent builders never load a half-written file


def _switched_off() -> bool:
    return variables.read("FORGE_CPU_KERNELS") == "0"


def _compiler() -> str | None:
    """The C compiler to build with (``$CC``, default ``cc``), or None when there is none."""
    return shutil.which(variables.read("CC"))


def compiler_present() -> bool:
    """Whether the kernels can be built here: a compiler is found and they are not switched off."""
    return not _switched_off() and _compiler() is not None


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels, building them if needed; None (logged once) where they cannot be built."""
    if _switched_off():
        return None
    compiler = _compiler()
    if compiler is None:
        log.warning("no C compiler found (set CC): the engine uses its slower pure-torch attention on CPU")
        return None
    flags = _flags()
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *flags]).encode() + _cpu_identity().encode())
    key = key.hexdigest()
    target = _cache_dir() / f"paged_attention-{key[:16]}.so"
    try:
        if not target.exists():
            _build(compiler, flags, target)
        library = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        log.warning("could not build the CPU attention kernel (%s): the engine uses pure-torch attention", detail)
        return None
    function = library.forge_paged_attention
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 8 + [ctypes.c_float]
    return library


def paged_attention(library: ctypes.CDLL, q: Tensor, key_cache: Tensor, value_cache: Tensor, tables: Tensor,
                    query_slots: Tensor, key_lower: int, scale: float) -> Tensor:
    """Attention of ``q`` [B, Hq, T, D] over one layer's paged cache [blocks, block_size, Hkv, D]: query t of row b
    sees slots ``key_lower`` .. ``query_slots[b, t]`` of the blocks in ``tables[b]``. fp32 CPU tensors only."""
    q = q.contiguous()
    tables, query_slots = tables.contiguous(), query_slots.contiguous()
    batch, heads, length, dim = q.shape
    _, block_size, kv_heads, _ = key_cache.shape
    if key_cache.dtype != torch.float32 or q.dtype != torch.float32 or not key_cache.is_contiguous():
        raise ValueError("the CPU attention kernel takes contiguous fp32 tensors")
    if tables.dtype != torch.int64 or query_slots.dtype != torch.int64 or query_slots.shape != (batch, length):
        raise ValueError("tables and query_slots must be int64, query_slots [B, T]")
    out = torch.empty_like(q)
    status = library.forge_paged_attention(
        q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), query_slots.data_ptr(),
        out.data_ptr(), batch, heads, length, kv_heads, dim, block_size, tables.shape[1], key_lower, scale)
    if status != 0:
        raise RuntimeError({-1: "out of memory for attention scores", -2: "a query sees no key"}.get(status, status))
    return out
