"""Importance ratios for the dash: per completion token of a recorded session, the ratio of a learner checkpoint's
policy to the behaviour policy the actor recorded, exp(learner − recorded), with the learner's log-probability
recomputed as the learner does (``forge.learner.recompute``), so it is the ratio the learner would weigh the token
by if it trained on the session with that checkpoint's weights.

A pool's learner is the one beside it (RUN_DIR/learner for RUN_DIR/pool, RUN_DIR/NAME/learner for a multi-run's
NAME/pool); its checkpoints are learner/checkpoints/step-NNNNNNNN/model. One checkpoint is loaded at a time, on
first use, in the ratios' own worker thread (a load or a forward pass never runs on the event loop, and two never
run at once)."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge.pool import InvalidRequestError, NotFoundError
from forge.v1 import pool_pb2

if TYPE_CHECKING:
    from forge.model.policy import Policy
    from forge.sampling.grammar import Grammars

MAX_TOKENS = 32_768         # prompt and completion tokens of all a session's calls: more is refused
STEP = re.compile(r"step-(\d+)")
NO_CHECKPOINT = "no learner checkpoint in this run"


def checkpoints_dir(pool_path: Path) -> Path:
    """The checkpoints of the learner beside the pool at ``pool_path``."""
    return pool_path.parent / "learner" / "checkpoints"


def steps(directory: Path) -> list[int]:
    """The steps of the complete checkpoints in ``directory``, oldest first (a checkpoint being written is still
    in a staging folder, not listed)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = STEP.fullmatch(path.name)
        if match and (path / "model" / "config.json").is_file():
            found.append(int(match.group(1)))
    return sorted(found)


def latest(directory: Path, known: Sequence[int]) -> int | None:
    """The step ``latest`` names, or the newest of ``known`` when it names none of them."""
    try:
        match = STEP.fullmatch((directory / "latest").read_text().strip())
    except OSError:
        match = None
    if match and int(match.group(1)) in known:
        return int(match.group(1))
    return max(known) if known else None


def listing(directory: Path) -> dict[str, Any]:
    """{"steps": [...], "latest": step or None} of the checkpoints in ``directory``."""
    known = steps(directory)
    return {"steps": known, "latest": latest(directory, known)}


def pick(directory: Path, step: int | None) -> Path:
    """The model folder of checkpoint ``step`` (None: the latest); NotFoundError when there is none."""
    known = steps(directory)
    if not known:
        raise NotFoundError(NO_CHECKPOINT)
    if step is None:
        step = latest(directory, known)
    elif step not in known:
        shown = ", ".join(map(str, known[-10:]))
        raise NotFoundError(f"no learner checkpoint of step {step} (steps: {shown})")
    return directory / f"step-{step:08d}" / "model"


def session_calls(found: pool_pb2.SessionWithCalls, limit: int = MAX_TOKENS) -> list[pool_pb2.CallRecord]:
    """The session's calls in order; InvalidRequestError when they hold more than ``limit`` tokens in all."""
    calls = sorted(found.calls, key=lambda c: c.index)
    total = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    if total > limit:
        raise InvalidRequestError(f"the session's {len(calls)} calls hold {total} tokens, more than the dash "
                                  f"recomputes ({limit})")
    return calls


def _finite(values: Sequence[float]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in values]


@dataclass
class Loaded:
    model_dir: Path
    model: Policy
    grammars: Grammars


class Ratios:
    """The checkpoint loaded last and the worker thread that loads checkpoints and runs forward passes."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dash-ratios")
        self._lock = threading.Lock()
        self._loaded: Loaded | None = None

    def _load(self, model_dir: Path) -> Loaded:
        if self._loaded is not None and self._loaded.model_dir == model_dir:
            return self._loaded
        self._loaded = None         # the previous one goes first: at most one model in memory
        from forge.checkpoints import load_model
        from forge.sampling.grammar import Grammars

        try:
            model, _ = load_model(model_dir)
        except OSError as exc:      # pruned by the learner since it was listed
            raise NotFoundError(f"the learner checkpoint {model_dir.parent.name} is gone: {exc}") from exc
        if hasattr(model, "eval"):
            model.eval()
        config = model.config
        self._loaded = Loaded(model_dir, model, Grammars(model_dir, config.vocab_size, tuple(config.eos_token_ids)))
        return self._loaded

    def compute(self, model_dir: Path, calls: Sequence[pool_pb2.CallRecord]) -> list[dict[str, Any]]:
        """Per call: its index, and per completion token the ratio and the learner's log-probability (None for a
        value that is not finite, and for every token of a call the learner would leave out)."""
        import torch

        from forge.learner.recompute import learner_logprobs

        with self._lock:
            loaded = self._load(model_dir)
            learner = learner_logprobs(loaded.model, calls, loaded.grammars)
        out = []
        for call, values in zip(calls, learner, strict=True):
            reason = ("its sampling cannot be replayed: the learner leaves it out" if values is None else
                      "its recorded log-probs do not match its tokens" if len(call.logprobs) != len(values) else None)
            if values is None or reason is not None:
                out.append({"index": call.index, "ratio": None, "logprob": None, "skipped": reason})
                continue
            ratio = torch.exp(values - torch.tensor(list(call.logprobs), dtype=torch.float32))
            out.append({"index": call.index, "ratio": _finite(ratio.tolist()), "logprob": _finite(values.tolist())})
        return out

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._loaded = None


def step_of(model_dir: Path) -> int:
    match = STEP.fullmatch(model_dir.parent.name)
    assert match is not None
    return int(match.group(1))
