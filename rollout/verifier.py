"""A team's own verifier: ``score(task, reply, session) -> float | dict[str, float]`` (``def`` or ``async def``),
named by a spec (``module:score`` or ``file.py:score``) and run so that it never blocks the rollout loop: a plain
function in a thread pool of its own, either kind under a timeout. Whatever goes wrong with one score (it raises,
times out, returns something that is not a score) is a ``VerificationFailed`` saying why. See docs/agents.md."""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from forge.loading import PluginError, first_line, load_object


class VerificationFailed(Exception):
    """One reply could not be scored; the message is the reason."""


def _short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def scores(result: object) -> dict[str, float]:
    """What a verifier returned as named scores: a number becomes ``{"score": value}``; a dict must map non-empty
    strings to finite numbers. ``VerificationFailed`` otherwise."""
    if _number(result):
        value = float(result)
        if not math.isfinite(value):
            raise VerificationFailed(f"verifier returned {value}, not a finite number")
        return {"score": value}
    if not isinstance(result, Mapping):
        raise VerificationFailed(f"verifier returned {_short(result)}, not a number or a dict of numbers")
    if not result:
        raise VerificationFailed("verifier returned an empty dict (give at least one named score)")
    named: dict[str, float] = {}
    for key, value in result.items():
        if not isinstance(key, str) or not key:
            raise VerificationFailed(f"verifier returned a dict with the key {_short(key)}: names of scores must "
                                     "be non-empty strings")
        if not _number(value):
            raise VerificationFailed(f"verifier returned {_short(value)} for {key!r}, not a number")
        named[key] = float(value)
        if not math.isfinite(named[key]):
            raise VerificationFailed(f"verifier returned {named[key]} for {key!r}, not a finite number")
    return named


class Verifier:
    """Scores replies with ``fn(task, reply, session)`` off the event loop: a plain function runs in a pool of
    ``workers`` threads, an ``async def`` one is awaited (it must not block); each call has ``timeout_s`` seconds,
    counted from the call (a plain function's wait for a free thread included). A plain function that times out
    keeps its thread until it returns: Python cannot stop a thread."""

    def __init__(self, fn: Callable[..., Any], *, workers: int = 4, timeout_s: float = 60.0) -> None:
        if not callable(fn):
            raise TypeError(f"a verifier must be callable, got {_short(fn)}")
        if workers < 1:
            raise ValueError(f"a verifier needs at least 1 worker thread, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"a verifier's timeout must be positive, got {timeout_s}")
        self.fn = fn
        self.workers = workers
        self.timeout_s = timeout_s
        # An object with an async __call__ counts too: run in a thread, it would only hand back a coroutine.
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        self._pool = None if self.is_async else ThreadPoolExecutor(workers, thread_name_prefix="forge-verifier")
        self._closed = False

    async def _call(self, task: dict[str, Any], reply: str, session: dict[str, Any]) -> object:
        try:
            if self._pool is None:
                result = self.fn(task, reply, session)
            else:
                result = await asyncio.get_running_loop().run_in_executor(self._pool, self.fn, task, reply, session)
            if inspect.isawaitable(result):        # a plain function that hands back an awaitable
                result = await result
        except Exception as exc:                   # the user's code: whatever it raised is the reason
            raise VerificationFailed(f"verifier raised {first_line(exc)}") from exc
        return result

    async def score(self, task: dict[str, Any], reply: str, session: dict[str, Any]) -> dict[str, float]:
        """The reply's named scores (``{"score": x}`` for a verifier that returns a number);
        ``VerificationFailed`` with the reason when there are none."""
        if self._closed:
            raise RuntimeError("the verifier is closed")
        try:
            result = await asyncio.wait_for(self._call(task, reply, session), self.timeout_s)
        except TimeoutError:
            raise VerificationFailed(f"verifier timed out after {self.timeout_s:g} s") from None
        return scores(result)

    def close(self) -> None:
        """Shuts the thread pool down without waiting: calls not started are dropped."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def check_score_fn(fn: object, spec: str) -> None:
    """``PluginError`` unless ``fn`` can be called as ``fn(task, reply, session)``."""
    if isinstance(fn, type):
        raise PluginError("verifier", spec, f"{fn.__qualname__} is a class: name a function "
                                            "score(task, reply, session)")
    if not callable(fn):
        raise PluginError("verifier", spec, f"{_short(fn)} is not callable: name a function "
                                            "score(task, reply, session)")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):                # some built-ins have none to check
        return
    try:
        signature.bind(None, None, None)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        raise PluginError("verifier", spec, f"{name}{signature} cannot be called as score(task, reply, session): "
                                            f"{exc}") from None


def load_verifier(spec: str, base_dir: Path | None = None, *, workers: int = 4, timeout_s: float = 60.0) -> Verifier:
    """The verifier ``spec`` names (``package.module:score`` or ``path/to/file.py:score``, relative to
    ``base_dir``), checked to take ``(task, reply, session)``. Raises ``PluginError``."""
    fn = load_object(spec, what="verifier", base_dir=base_dir)
    check_score_fn(fn, spec)
    return Verifier(fn, workers=workers, timeout_s=timeout_s)


__all__ = ["VerificationFailed", "Verifier", "check_score_fn", "load_verifier", "scores"]
