"""The rollout driver's run summary (``forge rollout --summary``): always whole on disk, continued by a driver
started again on it (the start's held-out reading kept, sessions added up), a file that is not a summary replaced;
and a signal cuts a held-out evaluation short."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from forge.rollout.cli import _unless
from forge.rollout.run_summary import RunSummary


def stats(episodes: int, failed: int, reward: dict[str, float]) -> SimpleNamespace:
    return SimpleNamespace(episodes=episodes, failed=failed, blackbox=episodes, failures=[f"f{i}" for i in range(failed)],
                           reward=lambda: reward)


def test_a_continued_run_keeps_its_start_and_adds_up_its_sessions(tmp_path):
    path = tmp_path / "run" / "summary.json"
    first = RunSummary.read(path)
    first.starts += 1
    first.eval_start = {"qa": 0.25}
    first.write(path)
    first.add(stats(10, 2, {"qa": 0.5}), minutes=3.0)
    first.write(path)
    assert [p.name for p in path.parent.iterdir()] == ["summary.json"]         # no side file left behind

    again = RunSummary.read(path)
    again.starts += 1
    assert again.eval_start == {"qa": 0.25} and again.episodes == 10
    again.add(stats(6, 9, {"qa": 0.75}), minutes=1.5)
    again.eval_end = {"qa": 0.5}
    again.write(path)
    written = json.loads(path.read_text())
    assert written["episodes"] == 16 and written["failed_episodes"] == 11 and written["starts"] == 2
    assert written["minutes"] == 4.5 and written["train_reward"] == {"qa": 0.75}
    assert len(written["failures"]) == 8                      # the latest reasons only
    assert (written["eval_start"], written["eval_end"]) == ({"qa": 0.25}, {"qa": 0.5})


def test_a_file_that_is_not_a_summary_starts_a_new_one(tmp_path):
    path = tmp_path / "summary.json"
    for text in ("{not json", "[1, 2]", '{"episodes": "many", "starts": 1}'):
        path.write_text(text)
        assert RunSummary.read(path) == RunSummary()
    assert RunSummary.read(None) == RunSummary()


def test_a_signal_cuts_an_evaluation_short_and_is_not_waited_on_otherwise():
    async def scenario():
        signalled = asyncio.Event()
        slow_ended = asyncio.Event()

        async def slow():
            try:
                await asyncio.Event().wait()
            finally:
                slow_ended.set()

        waiting = asyncio.ensure_future(_unless(signalled, slow()))
        await asyncio.sleep(0)
        signalled.set()
        assert await waiting is None
        await slow_ended.wait()                              # the evaluation was cancelled, not left running

        async def quick():
            return {"qa": 1.0}

        assert await _unless(asyncio.Event(), quick()) == {"qa": 1.0}

    asyncio.run(scenario())
