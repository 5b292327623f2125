"""The pool under crashes and other processes: every acknowledged call survives kill -9, a reader process sees
consistent snapshots while a writer writes (and grows the map), a learner process consumes every entry once while
another process writes, and a full disk is a clean PoolFullError. (Load in one process:
unit/test_pool_durability.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from forge.pool import Pool, PoolReader

from conftest import HELPERS
from helpers.pool_util import make_call, same_call

HELPER = HELPERS / "pool_appender.py"


def test_every_acknowledged_call_survives_kill_9(tmp_path):
    path = tmp_path / "pool"
    proc = subprocess.Popen([sys.executable, str(HELPER), "append", str(path), "--threads", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: list[tuple[str, int]] = []
    try:
        for line in proc.stdout:
            if line.startswith("ACK"):
                _, sid, index = line.split()
                acked.append((sid, int(index)))
            if len(acked) >= 300:
                break
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    acked += [(line.split()[1], int(line.split()[2])) for line in rest.splitlines() if line.startswith("ACK")]
    assert len(acked) >= 300, err
    with Pool(path) as pool:                             # reopen for writing: recovers cleanly after the crash
        stored = {}
        for entry in pool.entries(0, 100):
            for sid in entry.members:
                got = pool.get_session(sid)
                assert got.session.num_calls == len(got.calls)                      # nothing half-written
                assert [c.index for c in got.calls] == list(range(len(got.calls)))
                for call in got.calls:
                    assert same_call(call, make_call(sid, call.index, prompt_len=512, completion_len=64))
                stored[sid] = len(got.calls)
        missing = [(sid, index) for sid, index in acked if index >= stored.get(sid, 0)]
        assert not missing, f"acknowledged but lost: {missing[:5]}"
        pool.append_call(make_call("w0", stored["w0"]))    # and it takes new writes


def test_another_process_reads_consistent_snapshots_while_the_writer_writes_and_grows(tmp_path):
    path = tmp_path / "pool"
    with Pool(path, map_size=256 * 1024) as pool:
        sids = [pool.open_session(session_id=f"w{i}").session_id for i in range(4)]
        pool.append_call(make_call(sids[0], 0, prompt_len=512, completion_len=64))
        reader = subprocess.Popen([sys.executable, str(HELPER), "watch", str(path), "--seconds", "2.5"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stop = threading.Event()
        counts = dict.fromkeys(sids, 0)
        counts[sids[0]] = 1

        def write(sid: str) -> None:
            while not stop.is_set():
                pool.append_call(make_call(sid, counts[sid], prompt_len=512, completion_len=64))
                counts[sid] += 1

        writers = [threading.Thread(target=write, args=(sid,)) for sid in sids]
        for thread in writers:
            thread.start()
        try:
            out, err = reader.communicate(timeout=60)
        finally:
            stop.set()
            for thread in writers:
                thread.join()
        assert reader.returncode == 0, err
        _, snapshots, _, calls, _, map_size = out.split()
        assert int(snapshots) > 3 and int(calls) > 0
        assert pool.stats()["map_grows"] >= 1 and int(map_size) > 256 * 1024    # the reader followed the growth
        assert pool.stats()["calls_stored"] == sum(counts.values())


def test_a_learner_process_consumes_every_entry_once_while_the_gateway_process_writes(tmp_path):
    path = tmp_path / "pool"
    entries, window = 60, 4
    with Pool(path, map_size=64 * 1024) as pool:
        learner = subprocess.Popen([sys.executable, str(HELPER), "consume", str(path), "--entries", str(entries),
                                    "--window", str(window)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        try:
            for group in range(entries // 2):            # groups of two, closed out of order
                sids = [pool.open_session(group_id=f"g{group}", group_size=2).session_id for _ in range(2)]
                for sid in reversed(sids):
                    pool.append_call(make_call(sid, 0, prompt_len=1024))
                    pool.close_session(session_id=sid)
                solo = pool.open_session().session_id
                pool.append_call(make_call(solo, 0, prompt_len=1024))
                pool.close_session(session_id=solo)
            out, err = learner.communicate(timeout=90)
        finally:
            if learner.poll() is None:
                learner.kill()
        assert learner.returncode == 0, err
        taken = [int(p) for p in out.split()[1:]]
        assert sorted(taken) == list(range(entries))         # every entry exactly once
        cursor = pool.cursor()
        assert cursor.head == entries and pool.stats()["consumed"] == entries
        assert pool.stats()["map_grows"] >= 2                 # the other process followed the growth


FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, {helpers!r})
from pool_util import make_call
from forge.pool import Pool, PoolFullError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
pool = Pool({path!r}, map_size=1 << 20)
sid = pool.open_session(session_id="s").session_id
resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))    # the file may not grow past 3 MiB: a full disk
index = 0
try:
    while True:
        pool.append_call(make_call(sid, index, prompt_len=2000))
        index += 1
except PoolFullError as exc:
    print("FULL", index, exc, flush=True)
pool.close()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics")
def test_a_full_disk_is_a_clear_error_and_nothing_is_half_recorded(tmp_path):
    path = tmp_path / "pool"
    script = FULL_DISK.format(helpers=str(HELPER.parent), path=str(path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[0] == "FULL" and "pool is full" in result.stdout and "nothing" in result.stdout
    acknowledged = int(words[1])
    with PoolReader(path) as reader:
        got = reader.get_session("s")
        assert got.session.num_calls == len(got.calls) == acknowledged
        assert all(same_call(c, make_call("s", c.index, prompt_len=2000)) for c in got.calls)
