"""Pool test processes: ``append`` appends from several threads and prints "ACK <session> <index>" as each append is
acknowledged (the kill -9 test); ``watch`` checks snapshots as a read-only reader; ``consume`` is a learner that
fetches and consumes in its own process while another one writes."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pool_util import make_call

from forge.pool import Pool, PoolReader


def append(path: str, threads: int, calls: int, map_size: int) -> None:
    pool = Pool(path, map_size=map_size)
    lock = threading.Lock()

    def work(worker: int) -> None:
        sid = pool.open_session(session_id=f"w{worker}", task_id="kill").session_id
        for index in range(calls):
            pool.append_call(make_call(sid, index, prompt_len=512, completion_len=64))
            with lock:
                sys.stdout.write(f"ACK {sid} {index}\n")
                sys.stdout.flush()

    workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    print("DONE", flush=True)
    time.sleep(60)                      # wait to be killed


def watch(path: str, seconds: float) -> None:
    """Read snapshots while a writer writes: every snapshot must be consistent, and calls only ever grow."""
    reader = PoolReader(path)
    deadline = time.monotonic() + seconds
    last, snapshots = -1, 0
    while time.monotonic() < deadline:
        figures = reader.stats()
        calls = int(figures["calls_stored"])
        assert calls >= last, (calls, last)
        last = calls
        for entry in reader.entries(0, 1000):
            for sid in entry.members:
                got = reader.get_session(sid)
                assert got.session.num_calls == len(got.calls), sid
                assert [c.index for c in got.calls] == list(range(len(got.calls)))
                assert all(c.SerializeToString() == make_call(sid, c.index, prompt_len=512, completion_len=64)
                           .SerializeToString() for c in got.calls[-3:])
        snapshots += 1
    print(f"SNAPSHOTS {snapshots} CALLS {last} MAP {int(reader.stats()['map_size'])}", flush=True)


def consume(path: str, entries: int, window: int) -> None:
    """A learner in its own process: fetch within the window and consume until ``entries`` entries are taken."""
    pool = Pool(path, map_size=64 * 1024)
    taken: list[int] = []
    deadline = time.monotonic() + 60
    while len(taken) < entries and time.monotonic() < deadline:
        response = pool.fetch(window, include_calls=True)
        batch = [e.position for e in response.entries]
        for entry in response.entries:
            assert entry.position < response.head + window
            assert all(s.session.num_calls == len(s.calls) for s in entry.sessions)
        if batch:
            pool.consume(batch, expected_seq=response.seq)
            taken.extend(batch)
        else:
            time.sleep(0.005)
    pool.close()
    print("TAKEN", " ".join(map(str, taken)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["append", "watch", "consume"])
    parser.add_argument("path")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--map-size", type=int, default=1 << 30)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--window", type=int, default=4)
    args = parser.parse_args()
    if args.mode == "append":
        append(args.path, args.threads, args.calls, args.map_size)
    elif args.mode == "watch":
        watch(args.path, args.seconds)
    else:
        consume(args.path, args.entries, args.window)


if __name__ == "__main__":
    main()
