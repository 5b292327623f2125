"""What recording a call costs as its session's context grows: the pool's appends of a multi-turn session whose
context has reached 2k, 32k and 200k tokens, each call adding the same few new tokens, with the writer's memory of
sessions' last calls (``PoolConfig.last_calls_bytes``, the default) and without it (0: the writer reads the
session's stored calls back to find what the new prompt shares, the way the pool worked before the memory).

Each session opens with one call of the whole context (its cost, O(context) new tokens, is not counted), then makes
``--calls`` calls of ``--new`` prompt tokens and ``--completion`` completion tokens each; the figure is the process
CPU (every thread: the caller's checks and the writer's commit) of each of those appends, median over the calls and
``--repeats`` sessions. Flat across contexts is the claim: a call costs its new tokens, not its context.

Usage: python bench/pool_context.py [--contexts 2048 32768 200000] [--calls 32] [--new 256] [--completion 64]
       [--repeats 3] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

from forge.pool import Pool
from forge.v1 import common_pb2, pool_pb2

MODES = {"memory": None, "read back": 0}        # last_calls_bytes: the default, or none


def call(session_id: str, index: int, prompt: np.ndarray, completion: np.ndarray) -> pool_pb2.CallRecord:
    n = len(completion)
    return pool_pb2.CallRecord(session_id=session_id, index=index, prompt_ids=prompt.tolist(),
                               completion_ids=completion.tolist(), logprobs=[-0.5] * n, weight_versions=[1] * n,
                               actor="actor-0", finish_reason=common_pb2.FINISH_REASON_STOP)


def session_append_ms(pool: Pool, session_id: str, context: int, args: argparse.Namespace,
                      rng: np.random.Generator) -> list[float]:
    """Process CPU (ms) of each append after the first, in a session whose context starts at ``context`` ids."""
    pool.open_session(session_id=session_id)
    ids = rng.integers(0, 151_936, context, dtype=np.int32)
    completion = rng.integers(0, 151_936, args.completion, dtype=np.int32)
    pool.append_call(call(session_id, 0, ids, completion))
    costs = []
    for index in range(1, args.calls + 1):
        ids = np.concatenate((ids, completion, rng.integers(0, 151_936, args.new, dtype=np.int32)))
        completion = rng.integers(0, 151_936, args.completion, dtype=np.int32)
        record = call(session_id, index, ids, completion)       # built before the clock: the client's work
        started = time.process_time()
        pool.append_call(record)
        costs.append(1e3 * (time.process_time() - started))
    pool.close_session(session_id=session_id)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 32768, 200_000])
    parser.add_argument("--calls", type=int, default=32, help="calls counted per session")
    parser.add_argument("--new", type=int, default=256, help="new prompt tokens a call")
    parser.add_argument("--completion", type=int, default=64, help="completion tokens a call")
    parser.add_argument("--repeats", type=int, default=3, help="sessions per context and mode")
    parser.add_argument("--dir", default=None, help="where the pools are written (a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    results: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for mode, memory in MODES.items():
            settings = {} if memory is None else {"last_calls_bytes": memory}
            with Pool(f"{directory}/{mode.replace(' ', '-')}", **settings) as pool:
                for context in args.contexts:
                    costs = [ms for r in range(args.repeats)
                             for ms in session_append_ms(pool, f"s{context}-{r}", context, args, rng)]
                    results[mode][context] = statistics.median(costs)
    if args.json:
        print(json.dumps({"args": vars(args), "results": results}, indent=1))
        return
    print(f"process CPU per append, ms (median of {args.calls} calls x {args.repeats} sessions; {args.new} new prompt "
          f"+ {args.completion} completion tokens a call)")
    print(f"{'context':>8} " + " ".join(f"{mode:>10}" for mode in MODES) + "  read back / memory")
    for context in args.contexts:
        memory, read_back = results["memory"][context], results["read back"][context]
        print(f"{context:>8} {memory:>10.3f} {read_back:>10.3f}  {read_back / memory:>8.2f}x")
    first, last = args.contexts[0], args.contexts[-1]
    for mode in MODES:
        print(f"{mode}: {last} / {first} tokens of context = {results[mode][last] / results[mode][first]:.2f}x")


if __name__ == "__main__":
    main()
