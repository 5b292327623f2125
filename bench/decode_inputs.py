"""What the decode benchmarks share (``actor_decode.py`` and its vLLM section ``actor_vllm.py``): the model they
load, their synthetic prompts, the median they report, and running a measurement in a fresh process."""

from __future__ import annotations

import statistics

from forge.model import CausalLM


def load(model: str) -> CausalLM:
    from forge.checkpoints import load_model

    return load_model(model)[0]


def prompt_ids(index: int, length: int) -> list[int]:
    """The benchmarks' synthetic prompt number ``index`` (distinct per index, no shared prefix)."""
    return [(7 * index + j) % 1000 + 1 for j in range(length)]


def median(values: list[float]) -> float:
    return statistics.median(values)


def in_fresh_process(function, *args):
    """``function(*args)`` in a new (spawned) process, as a server would run it; its result."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()
