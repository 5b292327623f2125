"""Where a gateway's CPU goes: runs ``forge-gateway`` (same arguments) with the functions of each stage of a call
wrapped to add up the CPU time of the thread that runs them, and writes the totals to a JSON file (the path in
$FORGE_STAGES_OUT) each time the process gets SIGUSR1, and at exit. ``bench/gateway_load.py --stages`` starts its
gateways this way and reads the file before and after each measurement.

A stage's figure is the thread CPU of its functions, so time a thread spends waiting is not in it. When a wrapped
function calls another, the outer one gets the time (nothing is counted twice); what no stage holds (the transports,
the event loop, the glue between stages) is the process's CPU less the stages'. The wrappers cost about a
microsecond a call.

Usage: FORGE_STAGES_OUT=stages.json python bench/gateway_stages.py [forge-gateway arguments]
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT_ENV = "FORGE_STAGES_OUT"

# stage -> the functions that do its work, as "module:attribute path" where the calls look them up
STAGES: dict[str, tuple[str, ...]] = {
    "request": ("forge.gateway.http.app:prepare_call", "forge.gateway.servicer:chat_call_from_proto"),
    "template": ("forge.tokenizer.tokenizer:Tokenizer.render_chat",),
    "tokens": ("forge.gateway.tito:CallHistory.build", "forge.gateway.tito:CallHistory.add"),
    "routing": ("forge.gateway.routing.kv:KVRouter.choose", "forge.gateway.routing.round_robin:RoundRobinRouter.choose",
                "forge.gateway.routing.least_loaded:LeastLoadedRouter.choose",
                "forge.gateway.routing.session_affinity:SessionAffinityRouter.choose"),
    "completion": ("forge.gateway.detokenize:TextAssembler.feed", "forge.gateway.detokenize:TextAssembler.visible",
                   "forge.gateway.detokenize:TextAssembler.final", "forge.parsing.completion:CompletionParser.parse",
                   "forge.parsing.completion:CompletionParser.visible"),
    "answer": ("forge.gateway.http.openai:ChatCompletions.answer_samples", "forge.gateway.http.wire:WireFormat"
               ".answer_samples", "aiohttp.web:json_response", "forge.gateway.servicer:chat_chunk"),
    "pool": ("forge.pool.sessions:prepare_call", "forge.pool.writer:GroupCommitWriter._commit"),
}


class StageClock:
    """CPU nanoseconds and calls per stage, from every thread; the outermost wrapped call on a thread is counted."""

    def __init__(self) -> None:
        self.totals: dict[str, list[int]] = {stage: [0, 0] for stage in STAGES}
        self._lock = threading.Lock()
        self._depth = threading.local()

    def wrap(self, stage: str, function: Callable) -> Callable:
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise TypeError(f"{function.__qualname__} is a coroutine function: its thread CPU is not its own")

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "value", 0)
            if depth:
                return function(*args, **kwargs)
            self._depth.value = 1
            started = time.thread_time_ns()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.thread_time_ns() - started
                self._depth.value = 0
                with self._lock:
                    total = self.totals[stage]
                    total[0] += spent
                    total[1] += 1

        return timed

    def install(self) -> None:
        """Wrap every stage's functions where they are looked up (a module attribute or a class's method)."""
        for stage, targets in STAGES.items():
            for target in targets:
                module_name, _, path = target.partition(":")
                owner: Any = importlib.import_module(module_name)
                *outer, name = path.split(".")
                for part in outer:
                    owner = getattr(owner, part)
                if name not in vars(owner):
                    raise AttributeError(f"{target} is not defined there: the stage list needs updating")
                function = getattr(owner, name)
                timed = self.wrap(stage, function)
                setattr(owner, name, timed)
                home = sys.modules.get(function.__module__)
                if getattr(home, function.__qualname__, None) is function:
                    setattr(home, function.__qualname__, timed)     # pickled by name for the decoding process

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            stages = {stage: {"cpu_s": ns / 1e9, "calls": calls} for stage, (ns, calls) in self.totals.items()}
        return {"stages": stages, "written": time.time_ns()}

    def write(self, path: Path) -> None:
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(self.snapshot()))
        os.replace(partial, path)


def read(path: Path) -> dict[str, Any] | None:
    """The last totals written, or None before the first."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def main() -> None:
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"set {OUT_ENV} to the file the stage totals are written to")
    path = Path(out)
    clock = StageClock()
    clock.install()
    signal.signal(signal.SIGUSR1, lambda *_: clock.write(path))
    from forge.gateway.cli import main as gateway_main

    sys.argv[0] = "forge-gateway"
    try:
        gateway_main()
    finally:
        clock.write(path)


if __name__ == "__main__":
    main()
