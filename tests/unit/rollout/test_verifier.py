"""A team's own verifier: loaded from a file or a module and checked to take (task, reply, session); a plain function
runs in the verifier's threads, so a slow one never holds up another score or the event loop; an async one is
awaited; each call has a timeout; and every way a score can fail (it raises, hangs, returns something that is not a
score) is a ``VerificationFailed`` saying why. Nothing here waits on the clock but the timeouts of verifiers that
never return."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from forge.loading import PluginError
from forge.rollout.verifier import VerificationFailed, Verifier, check_score_fn, load_verifier

TASK = {"id": "t1", "messages": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}
SESSION = {"session_id": "s1"}


def run(coroutine):
    return asyncio.run(coroutine)


def score_with(fn, *, reply: str = "4", **options) -> dict[str, float]:
    verifier = Verifier(fn, **options)
    try:
        return run(verifier.score(TASK, reply, SESSION))
    finally:
        verifier.close()


def exact(task, reply, session):
    return float(reply == task["answer"])


async def exact_async(task, reply, session):
    await asyncio.sleep(0)
    return {"exact": float(reply == task["answer"]), "length": len(reply)}


@pytest.fixture
def never() -> Iterator[threading.Event]:
    """An event no verifier will see set while the test runs; set afterwards, so a blocked thread can end."""
    event = threading.Event()
    yield event
    event.set()


def test_a_number_becomes_the_score_and_a_dict_gives_named_scores():
    assert score_with(exact) == {"score": 1.0} and score_with(exact, reply="5") == {"score": 0.0}
    assert score_with(lambda task, reply, session: 3) == {"score": 3.0}
    assert score_with(lambda task, reply, session: np.float32(0.5)) == {"score": 0.5}
    assert score_with(lambda task, reply, session: {"a": 1, "b": -2.5}) == {"a": 1.0, "b": -2.5}
    named = score_with(exact_async, reply="4!")
    assert named == {"exact": 0.0, "length": 2.0} and all(type(v) is float for v in named.values())


def test_the_verifier_gets_the_task_reply_and_session_as_given():
    seen = []
    assert score_with(lambda task, reply, session: seen.append((task, reply, session)) or 1.0) == {"score": 1.0}
    assert seen == [(TASK, "4", SESSION)] and seen[0][0] is TASK and seen[0][2] is SESSION


@pytest.mark.parametrize(("returned", "reason"), [
    ("yes", "verifier returned 'yes', not a number or a dict of numbers"),
    (None, "verifier returned None, not a number or a dict of numbers"),
    (True, "verifier returned True, not a number or a dict of numbers"),
    ([1.0], "verifier returned [1.0], not a number or a dict of numbers"),
    ("x" * 500, f"verifier returned {repr('x' * 500)[:117]}..., not a number or a dict of numbers"),
    (math.nan, "verifier returned nan, not a finite number"),
    (-math.inf, "verifier returned -inf, not a finite number"),
    ({}, "verifier returned an empty dict (give at least one named score)"),
    ({"": 1.0}, "verifier returned a dict with the key '': names of scores must be non-empty strings"),
    ({1: 1.0}, "verifier returned a dict with the key 1: names of scores must be non-empty strings"),
    ({"a": 1.0, "b": "high"}, "verifier returned 'high' for 'b', not a number"),
    ({"a": False}, "verifier returned False for 'a', not a number"),
    ({"a": math.inf}, "verifier returned inf for 'a', not a finite number"),
])
def test_a_result_that_is_not_a_score_fails_with_the_reason(returned, reason):
    async def async_fn(task, reply, session):
        return returned

    for fn in (lambda task, reply, session: returned, async_fn):
        with pytest.raises(VerificationFailed) as caught:
            score_with(fn)
        assert str(caught.value) == reason


def test_a_verifier_that_raises_fails_with_the_exception_and_its_first_line():
    async def async_fn(task, reply, session):
        raise KeyError("answer")

    def raises_timeout(task, reply, session):
        raise TimeoutError("the grader's own timeout")

    def two_lines(task, reply, session):
        raise ValueError("\nno answer line\nin the reply")

    cases = [(lambda task, reply, session: 1 / 0, "verifier raised ZeroDivisionError: division by zero"),
             (async_fn, "verifier raised KeyError: 'answer'"),
             (raises_timeout, "verifier raised TimeoutError: the grader's own timeout"),
             (two_lines, "verifier raised ValueError: no answer line"),
             (lambda task, reply, session: task["missing"], "verifier raised KeyError: 'missing'")]
    for fn, reason in cases:
        with pytest.raises(VerificationFailed) as caught:
            score_with(fn)
        assert str(caught.value) == reason
        assert isinstance(caught.value.__cause__, Exception)


def test_a_slow_plain_verifier_runs_in_a_thread_and_never_holds_up_another_score():
    started, release = threading.Event(), threading.Event()
    threads = []

    def verify(task, reply, session):
        threads.append(threading.current_thread().name)
        if task["id"] == "slow":
            started.set()
            assert release.wait(60), "the test never released the slow verifier"
            return 0.5
        return 1.0

    async def scenario(verifier: Verifier) -> None:
        slow = asyncio.ensure_future(verifier.score({**TASK, "id": "slow"}, "4", SESSION))
        assert await asyncio.to_thread(started.wait, 60)          # the slow call holds its thread now
        assert await verifier.score(TASK, "4", SESSION) == {"score": 1.0}
        assert not slow.done()                                     # still held: the fast one did not wait for it
        release.set()
        assert await slow == {"score": 0.5}

    verifier = Verifier(verify, workers=2)
    try:
        run(scenario(verifier))
    finally:
        release.set()
        verifier.close()
    assert len(threads) == 2 and all(name.startswith("forge-verifier") for name in threads)


def test_an_async_verifier_is_awaited_on_the_event_loop():
    loops = []

    async def verify(task, reply, session):
        loops.append((asyncio.get_running_loop(), threading.current_thread()))
        return 1.0

    class Grader:
        async def __call__(self, task, reply, session):
            return {"grader": 2.0}

    async def scenario() -> None:
        verifier = Verifier(verify)
        assert verifier.is_async
        assert await verifier.score(TASK, "4", SESSION) == {"score": 1.0}
        assert loops == [(asyncio.get_running_loop(), threading.main_thread())]
        grader = Verifier(Grader())
        assert grader.is_async and await grader.score(TASK, "4", SESSION) == {"grader": 2.0}

    run(scenario())


def test_a_plain_function_that_hands_back_an_awaitable_is_awaited():
    async def later():
        return 0.25

    assert score_with(lambda task, reply, session: later()) == {"score": 0.25}


def test_a_verifier_that_never_returns_times_out_and_the_next_score_still_works(never):
    def hangs(task, reply, session):
        if task["id"] == "hang":
            never.wait()
        return 1.0

    async def scenario(verifier: Verifier) -> None:
        with pytest.raises(VerificationFailed) as caught:
            await verifier.score({**TASK, "id": "hang"}, "4", SESSION)
        assert str(caught.value) == "verifier timed out after 0.05 s"
        verifier.timeout_s = 60                    # the next call may take as long as this machine needs
        assert await verifier.score(TASK, "4", SESSION) == {"score": 1.0}       # the other thread is free

    verifier = Verifier(hangs, workers=2, timeout_s=0.05)
    try:
        run(scenario(verifier))
    finally:
        never.set()
        verifier.close()


def test_an_async_verifier_that_never_returns_times_out():
    async def hangs(task, reply, session):
        await asyncio.Event().wait()

    with pytest.raises(VerificationFailed) as caught:
        score_with(hangs, timeout_s=1.0)
    assert str(caught.value) == "verifier timed out after 1 s"


def test_a_closed_verifier_scores_nothing_and_bad_settings_are_refused():
    verifier = Verifier(exact)
    verifier.close()
    verifier.close()
    with pytest.raises(RuntimeError, match="the verifier is closed"):
        run(verifier.score(TASK, "4", SESSION))
    with pytest.raises(ValueError, match="at least 1 worker"):
        Verifier(exact, workers=0)
    with pytest.raises(ValueError, match="timeout must be positive"):
        Verifier(exact, timeout_s=0)
    with pytest.raises(TypeError, match="must be callable"):
        Verifier(3)


VERIFIERS = """
import verifier_helper_xyz

def score(task, reply, session):
    return verifier_helper_xyz.grade(task, reply)

async def score_async(task, reply, session):
    return {"exact": verifier_helper_xyz.grade(task, reply)}

def score_varargs(*args):
    return 1.0

def score_defaults(task, reply, session=None, extra=2):
    return 1.0

def two_arguments(task, reply):
    return 1.0

def keyword_only(task, reply, session, *, rubric):
    return 1.0

class Scorer:
    def __init__(self, task, reply, session):
        pass

class Bound:
    def score(self, task, reply, session):
        return 0.75

BOUND = Bound().score
THRESHOLD = 0.5
"""


@pytest.fixture
def verifier_file(tmp_path):
    (tmp_path / "verifier_helper_xyz.py").write_text("def grade(task, reply):\n"
                                                     "    return float(reply == task['answer'])\n")
    (tmp_path / "verify.py").write_text(VERIFIERS)
    return tmp_path / "verify.py"


@pytest.mark.parametrize(("name", "expected"), [
    ("score", {"score": 1.0}),
    ("score_async", {"exact": 1.0}),
    ("score_varargs", {"score": 1.0}),
    ("score_defaults", {"score": 1.0}),
    ("BOUND", {"score": 0.75}),
])
def test_a_verifier_is_loaded_from_a_file_relative_to_base_dir(tmp_path, verifier_file, name, expected):
    verifier = load_verifier(f"verify.py:{name}", base_dir=tmp_path)
    try:
        assert run(verifier.score(TASK, "4", SESSION)) == expected
    finally:
        verifier.close()
    assert verifier.is_async == (name == "score_async")


def test_a_verifier_is_loaded_from_a_module_with_its_settings(tmp_path, verifier_file, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    verifier = load_verifier("verify:score", workers=1, timeout_s=5)
    try:
        assert (verifier.workers, verifier.timeout_s) == (1, 5)
        assert run(verifier.score(TASK, "5", SESSION)) == {"score": 0.0}
    finally:
        verifier.close()


@pytest.mark.parametrize(("name", "reason"), [
    ("THRESHOLD", "0.5 is not callable: name a function score(task, reply, session)"),
    ("Scorer", "Scorer is a class: name a function score(task, reply, session)"),
    ("two_arguments", "two_arguments(task, reply) cannot be called as score(task, reply, session): "
                      "too many positional arguments"),
    ("keyword_only", "keyword_only(task, reply, session, *, rubric) cannot be called as score(task, reply, session): "
                     "missing a required argument: 'rubric'"),
    ("missing", "file 'verify.py' has no attribute 'missing'"),
])
def test_a_spec_that_names_no_usable_verifier_is_refused_at_load_time(tmp_path, verifier_file, name, reason):
    with pytest.raises(PluginError) as caught:
        load_verifier(f"verify.py:{name}", base_dir=tmp_path)
    assert str(caught.value) == f"verifier 'verify.py:{name}': {reason}"


def test_a_built_in_without_a_signature_is_accepted():
    check_score_fn(print, "builtins:print")
