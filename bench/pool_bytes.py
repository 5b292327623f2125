"""Bytes the Data Pool writes a recorded token, against the bytes its ids and log-probs hold (8 a new token), and
against the same records kept as a store keyed by session would keep them.

``--sessions`` sessions make ``--calls`` calls each, appended in turn in random order, as a gateway's calls arrive:
a first prompt of ``--first`` tokens, then each call ``--new`` new prompt tokens after the previous call's prompt and
completion, and ``--completion`` completion tokens with their log-probs and versions. The pool's figure is the growth
of its LMDB file's used pages (sessions, queue entries and the free pages of its transactions included). The
baseline writes the records the pool stored (the same bytes) to a bare LMDB database keyed by session and call index,
in the same order, in transactions as large as the pool's commits: what a pool without append order would write at
best. Each shape is a row; ``x ids`` is bytes over 8 a new token.

Usage: python bench/pool_bytes.py [--sessions 256] [--calls 8] [--shapes 256:32:32 256:20:260 256:64:600 ...]
       [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from concurrent.futures import wait
from pathlib import Path

import lmdb
import numpy as np

from forge.pool import Pool
from forge.pool.layout import call_key
from forge.v1 import common_pb2, pool_pb2

BYTES_PER_TOKEN = 8             # an int32 id and a float32 log-prob
VOCAB = 151_936
IN_TURN = 32                    # appends submitted together, as concurrent calls reach the writer


def shape_of(text: str) -> tuple[int, int, int]:
    first, new, completion = (int(v) for v in text.split(":"))
    if first < 1 or new < 0 or completion < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: first >= 1, new >= 0 and completion >= 1 tokens")
    return first, new, completion


def record_pool(path: Path, sessions: int, calls: int, shape: tuple[int, int, int], seed: int
                ) -> tuple[int, int, list[tuple[str, int]]]:
    """(bytes written, new tokens, the calls in append order) of the interleaved sessions."""
    first, new, completion = shape
    rng, draw = random.Random(seed), np.random.default_rng(seed)
    with Pool(path) as pool:
        before = pool.stats()["bytes_used"]
        ids = [pool.open_session(task_id="bytes").session_id for _ in range(sessions)]
        prompts = {s: draw.integers(0, VOCAB, first, dtype=np.int32) for s in ids}
        made = dict.fromkeys(ids, 0)
        order, new_tokens, live = [], 0, list(ids)
        while live:
            batch = rng.sample(live, min(IN_TURN, len(live)))
            pending = []
            for session in batch:
                index = made[session]
                out = draw.integers(0, VOCAB, completion, dtype=np.int32)
                record = pool_pb2.CallRecord(
                    session_id=session, index=index, prompt_ids=prompts[session].tolist(), completion_ids=out.tolist(),
                    logprobs=(-draw.random(completion)).tolist(), weight_versions=[1] * completion, actor="actor-0",
                    timing=common_pb2.Timing(queue_s=0.01, prefill_s=0.02, decode_s=0.3, total_s=0.33),
                    finish_reason=common_pb2.FINISH_REASON_STOP, sampling=common_pb2.SamplingParams(temperature=1.0))
                pending.append(pool.append_call_async(record))
                order.append((session, index))
                new_tokens += (first if index == 0 else new) + completion
                prompts[session] = np.concatenate((prompts[session], out, draw.integers(0, VOCAB, new, dtype=np.int32)))
                made[session] += 1
                if made[session] == calls:
                    live.remove(session)
            wait(pending)
            for future in pending:
                future.result()
        return pool.stats()["bytes_used"] - before, new_tokens, order


def record_by_session(pool_path: Path, path: Path, order: list[tuple[str, int]]) -> int:
    """Bytes a bare LMDB database keyed by session and index takes for the pool's stored records."""
    with Pool(pool_path) as pool, pool.store.read() as tx:
        stored = {(s, i): data for s in {s for s, _ in order} for i, data in tx.call_items(s)}
    env = lmdb.open(str(path), map_size=1 << 36, max_dbs=1)
    try:
        db = env.open_db(b"calls")
        for start in range(0, len(order), IN_TURN):
            with env.begin(write=True) as txn:
                for session, index in order[start:start + IN_TURN]:
                    txn.put(call_key(session, index), stored[(session, index)], db=db)
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--shapes", type=shape_of, nargs="+",
                        default=[shape_of(s) for s in ("256:32:32", "256:20:260", "256:64:600", "256:300:200")],
                        help="first prompt : new prompt a call : completion tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="where the pools are written (a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.sessions < 1 or args.calls < 1:
        parser.error("--sessions and --calls must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for n, shape in enumerate(args.shapes):
            pool_bytes, new_tokens, order = record_pool(Path(directory, f"pool-{n}"), args.sessions, args.calls,
                                                        shape, args.seed)
            baseline = record_by_session(Path(directory, f"pool-{n}"), Path(directory, f"by-session-{n}"), order)
            held = new_tokens * BYTES_PER_TOKEN
            rows.append({"shape": ":".join(map(str, shape)), "calls": len(order), "pool_bytes": pool_bytes,
                         "by_session_bytes": baseline, "pool_x_ids": pool_bytes / held,
                         "by_session_x_ids": baseline / held, "pool_vs_by_session": pool_bytes / baseline})
    if args.json:
        print(json.dumps({"args": {**vars(args), "shapes": [r["shape"] for r in rows]}, "rows": rows}, indent=1))
        return
    print(f"{args.sessions} sessions x {args.calls} calls appended in turn; shape: first prompt : new prompt a call : "
          "completion tokens; x ids: bytes over 8 a new token")
    print(f"{'shape':>12} {'pool B/call':>11} {'pool x ids':>10} {'by session x ids':>16} {'pool / by session':>17}")
    for r in rows:
        print(f"{r['shape']:>12} {r['pool_bytes'] / r['calls']:>11.0f} {r['pool_x_ids']:>10.2f} "
              f"{r['by_session_x_ids']:>16.2f} {r['pool_vs_by_session']:>17.2f}")


if __name__ == "__main__":
    main()
