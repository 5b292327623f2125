"""Browsing a large pool: the first page of the session list, a deep page, a filtered page and a transcript, on a
pool of realistic sessions (groups of 8, 4 calls each, 1-2k-token prompts, 256-token completions).

Reports the time of each read and what it decoded (``forge.pool.browse.Work``): a page's cost must not grow with the
pool, which tests/unit/core/test_pool_browse.py checks by counting the same work at two sizes. The baseline is what
code written against ``PoolReader`` does to list sessions without it: every queue entry read, every session decoded
with its calls, then filtered and cut to a page; the ratio is the baseline's time over the first page's.

Usage: python bench/pool_browse.py [--dir DIR] [--sessions 10000] [--page-size 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from forge.pool import Pool, PoolReader
from forge.pool.browse import SessionFilter, Work, list_sessions, transcript
from forge.v1 import common_pb2, pool_pb2

GROUP, CALLS, COMPLETION = 8, 4, 256


def record(path: Path, sessions: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with Pool(path, sync=False) as pool:
        for g in range(sessions // GROUP):
            members = [f"g{g:06d}-{i}" for i in range(GROUP)]
            for sid in members:
                pool.open_session(session_id=sid, task_id=f"t{g}", domain=("math", "code", "web")[g % 3],
                                  group_id=f"g{g}", group_size=GROUP)
            pending = []
            for sid in members:
                prompt = [rng.randrange(151_936) for _ in range(rng.randint(1024, 2048))]
                for c in range(CALLS):
                    completion = [rng.randrange(151_936) for _ in range(COMPLETION)]
                    pending.append(pool.append_call_async(pool_pb2.CallRecord(
                        session_id=sid, index=c, prompt_ids=prompt, completion_ids=completion,
                        logprobs=[-rng.expovariate(2.0) for _ in range(COMPLETION)],
                        weight_versions=[g // 4] * COMPLETION, actor="actor-0",
                        finish_reason=common_pb2.FINISH_REASON_STOP)))
                    prompt = prompt + completion
            for future in pending:
                future.result()
            for i, sid in enumerate(members):
                pool.close_session(session_id=sid, outcome_rewards={"correct": float(i % 2)})


def every_session_read(reader: PoolReader, page_size: int) -> list:
    """The baseline: the first page as code against ``PoolReader`` alone makes it (every session decoded)."""
    found = [reader.get_session(s) for e in reversed(reader.entries(start=0, limit=10**9)) for s in e.members]
    return found[:page_size]


def timed(read) -> tuple[float, Work]:
    work = Work()
    started = time.perf_counter()
    read(work)
    return time.perf_counter() - started, work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="Where to build the pool (a temporary directory under it).")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="forge-bench-browse-"))
    try:
        started = time.perf_counter()
        record(root / "pool", args.sessions)
        built_s = time.perf_counter() - started
        size = args.page_size
        middle = max(1, args.sessions // size // 2)
        reads = {
            "first page": lambda w, r: list_sessions(r, page_size=size, work=w),
            f"page {middle}": lambda w, r: list_sessions(r, page=middle, page_size=size, work=w),
            "first page, domain=web reward>=1 version>=5": lambda w, r: list_sessions(
                r, SessionFilter(domain="web", min_reward=1.0, min_version=5), page_size=size, work=w),
            "a transcript (4 calls, ids only)": lambda w, r: transcript(r, "g000000-0"),
        }
        results = []
        with PoolReader(root / "pool") as reader:
            for name, read in reads.items():
                seconds, work = timed(lambda w, read=read: read(w, reader))
                results.append({"read": name, "seconds": seconds, "entries": work.entries,
                                "sessions": work.sessions, "calls": work.calls})
            baseline_s, _ = timed(lambda w: every_session_read(reader, size))
        report = {"sessions": args.sessions, "baseline_s": baseline_s, "page_size": size, "build_s": built_s,
                  "bytes_on_disk": sum(p.stat().st_size for p in (root / "pool").iterdir()), "reads": results}
        if args.json:
            print(json.dumps(report, indent=2))
            return
        print(f"{args.sessions} sessions ({report['bytes_on_disk'] / 2**20:.0f} MiB) recorded in {built_s:.0f} s")
        for row in results:
            counted = (f"   decoded {row['entries']} entries, {row['sessions']} sessions, {row['calls']} calls"
                       if row["entries"] else "")
            print(f"  {row['read']:<46} {row['seconds'] * 1e3:8.1f} ms{counted}")
        first = results[0]["seconds"]
        print(f"  {'baseline: every session read, first page':<46} {baseline_s * 1e3:8.1f} ms   "
              f"ratio {baseline_s / first:.0f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
