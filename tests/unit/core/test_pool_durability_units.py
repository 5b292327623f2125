"""The pool under load in one process: concurrent appenders lose and mix up nothing, group commit batches, and
queued appends keep their order and are readable once acknowledged. (Under crashes and other processes:
integration/test_pool_durability.py.)"""

from __future__ import annotations

import threading

from forge.pool import Pool

from helpers.pool_util import make_call, same_call


def test_concurrent_appenders_lose_and_mix_up_nothing_and_commits_are_batched(tmp_path):
    threads, sessions_each, calls_each = 16, 3, 12
    with Pool(tmp_path / "pool") as pool:
        def work(worker: int) -> None:
            sids = [pool.open_session(session_id=f"w{worker}-{k}", group_id=f"g{worker}", group_size=sessions_each)
                    .session_id for k in range(sessions_each)]
            for index in range(calls_each):
                for sid in sids:
                    assert pool.append_call(make_call(sid, index)) == index
            for sid in sids:
                pool.close_session(session_id=sid)

        workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        stats = pool.stats()
        appends = threads * sessions_each * calls_each
        assert stats["calls"] == stats["calls_stored"] == appends
        assert stats["commits_total"] < stats["requests_total"] * 0.8, stats      # many requests per commit
        assert stats["batch_size_mean"] > 1.2
        response = pool.fetch(threads, include_calls=True)
        assert len(response.entries) == threads
        for entry in response.entries:
            assert len(entry.sessions) == sessions_each
            for item in entry.sessions:
                assert item.session.group_id == entry.group_id
                assert [c.index for c in item.calls] == list(range(calls_each))
                assert all(same_call(c, make_call(item.session.session_id, c.index)) for c in item.calls)


def test_queued_appends_keep_their_order_and_are_readable_once_acknowledged(tmp_path):
    with Pool(tmp_path / "pool") as pool:
        sid = pool.open_session().session_id
        futures = [pool.append_call_async(make_call(sid, i)) for i in range(50)]
        for index, future in enumerate(futures):
            assert future.result(timeout=30) == index
            assert len(pool.get_session(sid).calls) > index
