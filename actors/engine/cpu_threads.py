"""The torch CPU threads of a process that serves from an engine: they go to the engine's loop thread."""

from __future__ import annotations

import torch


def reserve_cpu_threads(threads: int = 0) -> int:
    """Leave the process's torch CPU threads to the engine's loop: make the calling thread single-threaded and
    return the count for ``EngineConfig.threads`` (``threads``, or what the caller had). Call it before any torch
    work in a process that serves from an engine.

    Why: GNU OpenMP, which torch's CPU kernels use, keeps a team of worker threads for every thread that ran
    parallel work. Once the teams together outnumber the cores it stops spinning between parallel regions, and every
    small op of a decode step then pays a futex wake-up: with the model loaded on the main thread at 2 threads, the
    engine's loop thread decoded 2-3x slower than on the main thread."""
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(1)
    return threads
