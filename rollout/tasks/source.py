"""A team's own tasks: a JSONL file (one task per line) or a Python task source (``module:function`` or
``file.py:function``), each task validated, with line numbers, before anything starts; the train/eval split; and the
endless shuffled stream of training tasks the rollout driver draws from. A task is a JSON object: ``id``,
``messages`` (OpenAI chat messages), optionally ``domain`` and ``tools`` (OpenAI tool schemas), and any other fields,
passed untouched to the agent and the verifier. See docs/agents.md."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from forge.loading import PluginError, first_line, load_object
from forge.rollout.tasks.task_checks import DEFAULT_DOMAIN, ROLES, TaskError, kind_name, validate_task

MAX_TASKS = 1_000_000              # a Python source giving more is an error, so an endless generator cannot hang


class _Tasks:
    """Tasks checked one by one, each id remembered with where it is: in full (``path:3``) and within its set
    (``on line 3``)."""

    def __init__(self) -> None:
        self.tasks: list[dict[str, Any]] = []
        self.where: dict[str, tuple[str, str]] = {}

    def add(self, task: object, where: str, place: str) -> None:
        checked = validate_task(task, where)
        if checked["id"] in self.where:
            first = self.where[checked["id"]][1]
            raise TaskError(f"{where}: duplicate id {checked['id']!r} (first {first})")
        self.where[checked["id"]] = (where, place)
        self.tasks.append(checked)


def _jsonl(path: Path) -> _Tasks:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TaskError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TaskError(f"{path}: is a folder, not a JSONL file") from None
    except OSError as exc:
        raise TaskError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    found = _Tasks()
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise TaskError(f"{path}:{number}: not UTF-8 text (byte {exc.start + 1} of the line)") from None
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}:{number}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        found.add(task, f"{path}:{number}", f"on line {number}")
    if not found.tasks:
        raise TaskError(f"{path}: no tasks in it (the file is empty)")
    return found


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """The tasks of a JSONL file, one JSON object a line (blank lines skipped), every one checked before any is
    returned: ``TaskError("{path}:{line}: {reason}")`` for the first that is not a valid task or repeats an id."""
    return _jsonl(Path(path)).tasks


def _python(spec: str, base_dir: Path | None) -> _Tasks:
    try:
        source = load_object(spec, what="task source", base_dir=base_dir)
    except PluginError as exc:
        raise TaskError(str(exc)) from exc
    try:
        produced = source() if callable(source) else source
    except Exception as exc:
        raise TaskError(f"task source {spec!r} raised {first_line(exc)}") from exc
    if isinstance(produced, (str, bytes, dict)) or not isinstance(produced, Iterable):
        if produced is source:
            raise TaskError(f"task source {spec!r} is neither a function returning tasks nor an iterable of them "
                            f"(got {kind_name(produced)})")
        raise TaskError(f"task source {spec!r} returned no iterable of tasks (got {kind_name(produced)})")
    found = _Tasks()
    try:
        for index, task in enumerate(islice(produced, MAX_TASKS + 1)):
            if index == MAX_TASKS:
                raise TaskError(f"task source {spec!r}: more than {MAX_TASKS:,} tasks (an endless generator?)")
            found.add(task, f"{spec}[{index}]", f"at index {index}")
    except TaskError:
        raise
    except Exception as exc:
        raise TaskError(f"task source {spec!r} raised {first_line(exc)} (at index {len(found.tasks)})") from exc
    if not found.tasks:
        raise TaskError(f"task source {spec!r}: no tasks")
    return found


def python_tasks(spec: str, base_dir: Path | None = None) -> list[dict[str, Any]]:
    """The tasks of a Python task source: ``spec`` (``package.module:name`` or ``file.py:name``, see
    ``forge.loading.load_object``) names a function returning an iterable of task dicts, or such an iterable
    itself. Every task is checked as ``read_jsonl`` checks a line: ``TaskError("{spec}[{index}]: {reason}")``."""
    return _python(spec, base_dir).tasks


@dataclass(frozen=True)
class TaskSet:
    """A run's tasks: those it trains on, and those it evaluates on (none when it has no eval set)."""

    train: tuple[dict[str, Any], ...]
    eval: tuple[dict[str, Any], ...] = ()

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains of all its tasks, train and eval, sorted."""
        return tuple(sorted({task["domain"] for task in (*self.train, *self.eval)}))


def held_out(total: int, fraction: float, seed: int) -> set[int]:
    """The indices of ``total`` tasks (at least 2) that ``fraction`` holds out, as ``seed`` decides: at least one on
    each side."""
    size = min(max(round(total * fraction), 1), total - 1)
    return set(random.Random(seed).sample(range(total), size))


def split(tasks: Sequence[dict[str, Any]], fraction: float, seed: int) -> TaskSet:
    """``tasks`` (at least 2) as train and held-out sides (``held_out``); all train when ``fraction`` is 0."""
    held = held_out(len(tasks), fraction, seed) if fraction else set()
    return TaskSet(train=tuple(t for i, t in enumerate(tasks) if i not in held),
                   eval=tuple(t for i, t in enumerate(tasks) if i in held))


def _split(found: _Tasks, fraction: float, seed: int) -> tuple[_Tasks, _Tasks]:
    total = len(found.tasks)
    if total < 2:
        raise TaskError(f"eval_fraction {fraction:g} needs at least 2 tasks to split, the train set has {total}")
    held = held_out(total, fraction, seed)
    train, evaluation = _Tasks(), _Tasks()
    for index, task in enumerate(found.tasks):
        side = evaluation if index in held else train
        side.tasks.append(task)
        side.where[task["id"]] = found.where[task["id"]]
    return train, evaluation


def _dataset(spec, base_dir: Path | None) -> _Tasks:
    from forge.rollout.tasks.dataset_source import dataset_tasks

    found = _Tasks()
    for task, where, place in dataset_tasks(spec, base_dir):
        found.add(task, where, place)
    if not found.tasks:
        raise TaskError(f"dataset {spec.dataset} [{spec.split}]: no rows")
    return found


def load_task_set(*, train: str | None, eval: str | None = None, eval_fraction: float = 0.0,
                  source: str | None = None, seed: int = 0, base_dir: Path | None = None, dataset=None,
                  eval_dataset=None) -> TaskSet:
    """A run's tasks, all checked: the training tasks from exactly one of ``train`` (a JSONL file), ``source``
    (a Python task source) and ``dataset`` (a ``DatasetSpec``); the eval tasks from ``eval`` (a JSONL file),
    ``eval_dataset`` (another split of the dataset) or, with ``eval_fraction`` (0 < f < 1), a split of the training
    tasks that ``seed`` decides (at least one task on each side), or none. Relative paths are relative to
    ``base_dir`` (the run file's folder) when given. Raises ``TaskError``."""
    if sum(x is not None for x in (train, source, dataset)) != 1:
        raise TaskError("give the training tasks as one of train (a JSONL file), source (a Python task source) and "
                        "dataset" + (", not several" if train is not None or source is not None else ""))
    is_number = isinstance(eval_fraction, (int, float)) and not isinstance(eval_fraction, bool)
    if not (is_number and 0 <= eval_fraction < 1):
        raise TaskError(f"eval_fraction must be a number from 0 (no split) up to, not including, 1; "
                        f"got {eval_fraction!r}")
    if eval is not None and eval_fraction:
        raise TaskError("give either eval (a JSONL file) or eval_fraction (a split of the training tasks), not both")

    def path(name: str) -> Path:
        given = Path(name).expanduser()
        return base_dir / given if base_dir is not None and not given.is_absolute() else given

    if source is not None:
        found = _python(source, base_dir)
    elif dataset is not None:
        found = _dataset(dataset, base_dir)
    else:
        found = _jsonl(path(train))
    if eval_fraction:
        found, evaluation = _split(found, eval_fraction, seed)
    elif eval is not None or eval_dataset is not None:
        evaluation = _jsonl(path(eval)) if eval is not None else _dataset(eval_dataset, base_dir)
        for task in evaluation.tasks:
            if task["id"] in found.where:
                raise TaskError(f"{evaluation.where[task['id']][0]}: id {task['id']!r} is also in the train set "
                                f"({found.where[task['id']][0]})")
    else:
        evaluation = _Tasks()
    return TaskSet(train=tuple(found.tasks), eval=tuple(evaluation.tasks))


def task_cycle(tasks: Sequence[dict[str, Any]], seed: int) -> Iterator[dict[str, Any]]:
    """The tasks over and over, each pass in a new shuffled order; the same order for the same ``seed``."""
    if not tasks:
        raise ValueError("task_cycle needs at least one task")
    order = list(tasks)
    rng = random.Random(seed)

    def cycle() -> Iterator[dict[str, Any]]:
        while True:
            rng.shuffle(order)
            yield from order

    return cycle()


__all__ = ["DEFAULT_DOMAIN", "MAX_TASKS", "ROLES", "TaskError", "TaskSet", "held_out", "load_task_set",
           "python_tasks", "read_jsonl", "split", "task_cycle", "validate_task"]
