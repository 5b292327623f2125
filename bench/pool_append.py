"""Durable Data Pool appends against raw LMDB puts of the same bytes.

Each pool append is one realistic LLM call (1-4k prompt ids, 256 completion ids with log-probabilities and weight
versions), acknowledged only after an fsynced commit; appenders run as 1, 8 and 64 threads, each on its own
session, and group commit batches whatever they submit together. The baselines write the same serialised records
with raw LMDB in one thread: one synced transaction per put (what a pool without group commit could do at best), and
batched puts (``--batch`` per synced transaction; the ceiling for the storage alone).

Usage: python bench/pool_append.py [--dir DIR] [--calls 2000] [--repeats 3] [--concurrency 1 8 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import lmdb

from forge.pool import Pool
from forge.v1 import common_pb2, pool_pb2


def realistic_calls(n: int, seed: int = 0) -> list[pool_pb2.CallRecord]:
    rng = random.Random(seed)
    calls = []
    for _ in range(n):
        completion = 256
        calls.append(pool_pb2.CallRecord(
            prompt_ids=[rng.randrange(151_936) for _ in range(rng.randint(1024, 4096))],
            completion_ids=[rng.randrange(151_936) for _ in range(completion)],
            logprobs=[-rng.expovariate(2.0) for _ in range(completion)], weight_versions=[17] * completion,
            actor="actor-0", timing=common_pb2.Timing(queue_s=0.01, prefill_s=0.05, decode_s=1.2, total_s=1.26),
            finish_reason=common_pb2.FINISH_REASON_STOP, sampling=common_pb2.SamplingParams(temperature=1.0),
            created_at=time.time()))
    return calls


def bench_pool(root: Path, calls: list[pool_pb2.CallRecord], appenders: int) -> dict[str, float]:
    path = Path(tempfile.mkdtemp(dir=root))
    per_thread = len(calls) // appenders
    with Pool(path) as pool:
        sessions = [pool.open_session(session_id=f"bench-{t}").session_id for t in range(appenders)]
        records = []
        for t, sid in enumerate(sessions):
            mine = []
            for index in range(per_thread):
                record = pool_pb2.CallRecord()
                record.CopyFrom(calls[t * per_thread + index])
                record.session_id, record.index = sid, index
                mine.append(record)
            records.append(mine)
        barrier = threading.Barrier(appenders + 1)

        def run(mine: list[pool_pb2.CallRecord]) -> None:
            barrier.wait()
            for record in mine:
                pool.append_call(record)

        threads = [threading.Thread(target=run, args=(mine,)) for mine in records]
        for thread in threads:
            thread.start()
        barrier.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        stats = pool.stats()
    shutil.rmtree(path, ignore_errors=True)
    total = per_thread * appenders
    payload = sum(r.ByteSize() for mine in records for r in mine)
    return {"calls_per_s": total / elapsed, "mb_per_s": payload / elapsed / 1e6,
            "batch_mean": stats.get("batch_size_mean", 1.0), "commit_ms_p50": stats.get("commit_latency_ms_p50", 0)}


def bench_raw(root: Path, payloads: list[bytes], batch: int) -> dict[str, float]:
    path = Path(tempfile.mkdtemp(dir=root))
    env = lmdb.open(str(path), map_size=1 << 34, max_dbs=2, sync=True, metasync=True)
    db = env.open_db(b"calls")
    started = time.perf_counter()
    for first in range(0, len(payloads), batch):
        with env.begin(write=True, db=db) as txn:
            for index in range(first, min(first + batch, len(payloads))):
                txn.put(index.to_bytes(8, "big"), payloads[index])
    elapsed = time.perf_counter() - started
    env.close()
    shutil.rmtree(path, ignore_errors=True)
    return {"calls_per_s": len(payloads) / elapsed, "mb_per_s": sum(map(len, payloads)) / elapsed / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("."), help="where to create the scratch pools (a real disk)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--batch", type=int, default=64, help="puts per transaction of the batched baseline")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pool-bench-", dir=args.dir))
    try:
        calls = realistic_calls(args.calls)
        payloads = [c.SerializeToString() for c in calls]
        size = statistics.mean(map(len, payloads))
        print(f"{len(calls)} calls per run, {size / 1024:.1f} KiB each on average (protobuf, packed ids); "
              f"{args.repeats} runs each; scratch under {root}")
        runs: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeats):
            runs.setdefault("raw LMDB, 1 synced txn per put", []).append(bench_raw(root, payloads, 1))
            runs.setdefault(f"raw LMDB, {args.batch} puts per synced txn", []).append(
                bench_raw(root, payloads, args.batch))
            for appenders in args.concurrency:
                runs.setdefault(f"pool, {appenders} appenders", []).append(bench_pool(root, calls, appenders))
        medians = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
                   for name, results in runs.items()}
        per_put = medians["raw LMDB, 1 synced txn per put"]["calls_per_s"]
        batched = medians[f"raw LMDB, {args.batch} puts per synced txn"]["calls_per_s"]
        print(f"{'':36s} {'calls/s':>10s} {'MB/s':>8s} {'vs per-put':>11s} {'vs batched':>11s} {'batch':>6s} "
              f"{'commit ms':>9s}")
        for name, m in medians.items():
            extra = f"{m['batch_mean']:6.1f} {m['commit_ms_p50']:9.2f}" if "batch_mean" in m else ""
            print(f"{name:36s} {m['calls_per_s']:10.0f} {m['mb_per_s']:8.1f} {m['calls_per_s'] / per_put:10.2f}x "
                  f"{m['calls_per_s'] / batched:10.2f}x {extra}")
        if args.json:
            print(json.dumps(medians, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
