"""Tasks from a dataset, one task a row: a Hugging Face dataset id (``org/name``, ``org/name@revision``) fetched
through ``huggingface_hub``'s cache (``HF_HOME``, ``HF_HUB_OFFLINE``, ``HF_TOKEN``, ``HF_ENDPOINT`` honoured), or a
local parquet, JSONL, JSON or CSV file or a folder of them, read with 🤗 ``datasets`` (the ``datasets`` extra,
imported only here). The rows stream: only those taken (``limit``) are read.

A row becomes a task: its prompt column made the user message (after the run's system prompt, when one is given)
or its messages column taken as the chat, its answer column as the text ``answer`` (what the built-in verifier
compares a reply's final answer with), its id column as ``id`` (else ``NAME-SPLIT-ROW``), a domain column or the
dataset's name as ``domain``, and every other column kept as it is: the agent and the verifier see them. Each task
is then checked as a JSONL line is (``validate_task``)."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.checkpoints.hub import HubError, HubId, fetch_dataset, parse_hub_id
from forge.rollout.tasks.task_checks import TaskError, validate_task

FIELDS = ("id", "prompt", "messages", "answer", "domain")
# The columns a field is read from when the run names none, in order of preference.
DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "id": ("id", "task_id", "uid"),
    "prompt": ("prompt", "question", "problem", "query", "input", "instruction"),
    "messages": ("messages", "conversation", "chat"),
    "answer": ("answer", "solution", "target", "output", "label"),
    "domain": ("domain",),
}
LOCAL_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
DATA_FILES = ("*.parquet", "*.jsonl", "*.json", "*.csv", "*.arrow", "*.txt", "*.md", "**/*.parquet",
              "**/*.jsonl", "**/*.json", "**/*.csv", "**/*.arrow")


@dataclass(frozen=True)
class DatasetSpec:
    """Where the tasks are and how a row reads as a task."""

    dataset: str                                     # a Hub id or a local file or folder
    split: str = "train"
    config: str | None = None                        # the dataset's configuration (subset), e.g. "main"
    columns: Mapping[str, str] = field(default_factory=dict)   # Forge's field -> the dataset's column
    system_prompt: str | None = None
    limit: int = 0                                   # at most this many rows (0: all)


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hub id (``org/name`` with an optional ``@revision``), not a file's path."""
    return parse_hub_id(text) is not None and not text.lower().endswith(tuple(LOCAL_FORMATS))


def locate(dataset: str, base_dir: Path | None) -> tuple[Path | None, HubId | None]:
    """(the local file or folder, None) for a path that exists, else (None, the Hub id); TaskError for neither."""
    given = Path(dataset).expanduser()
    path = base_dir / given if base_dir is not None and not given.is_absolute() else given
    if path.exists():
        return path, None
    if is_hub_id(dataset):
        return None, parse_hub_id(dataset)
    raise TaskError(f"dataset {dataset!r}: no such file or folder, and not a Hugging Face dataset id (org/name)")


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise TaskError("reading tasks from a dataset needs the datasets package: pip install 'forge-rl[datasets]'")\
            from None
    datasets.disable_progress_bars()
    return datasets


def _fetch(hub: HubId) -> Path:
    """The dataset repository's snapshot in huggingface_hub's cache, fetched when missing; TaskError, one line."""
    try:
        return fetch_dataset(hub, DATA_FILES)
    except HubError as exc:
        raise TaskError(f"dataset {exc}") from None


def _rows(spec: DatasetSpec, base_dir: Path | None) -> tuple[Iterator[dict[str, Any]], str]:
    """The split's rows, streamed, and the dataset's short name (the default domain)."""
    datasets = _import_datasets()
    local, hub = locate(spec.dataset, base_dir)
    source = local if local is not None else _fetch(hub)
    name = hub.repo_id.rsplit("/", 1)[-1] if hub is not None else source.stem
    try:
        if source.is_file():
            kind = LOCAL_FORMATS.get(source.suffix.lower())
            if kind is None:
                raise TaskError(f"{source}: not a parquet, JSONL, JSON or CSV file")
            found = datasets.load_dataset(kind, data_files={spec.split: str(source)}, split=spec.split, streaming=True)
        else:
            found = datasets.load_dataset(str(source), name=spec.config, split=spec.split, streaming=True)
        return iter(found), name
    except TaskError:
        raise
    except (ValueError, FileNotFoundError) as exc:
        raise TaskError(f"dataset {spec.dataset}: {str(exc).splitlines()[0]}") from None


def _column(row: Mapping[str, Any], field: str, columns: Mapping[str, str], where: str) -> str | None:
    """The column ``field`` is read from: the run's choice (which must exist), else the first default present."""
    if field in columns:
        if columns[field] not in row:
            raise TaskError(f"{where}: no column {columns[field]!r} (for {field}); the columns are {sorted(row)}")
        return columns[field]
    return next((c for c in DEFAULT_COLUMNS[field] if c in row), None)


def row_task(row: Mapping[str, Any], index: int, spec: DatasetSpec, name: str) -> dict[str, Any]:
    """Row ``index`` of the dataset as a task (module docstring), checked; TaskError naming the row."""
    where = f"dataset {spec.dataset} [{spec.split}] row {index}"
    chosen = {f: _column(row, f, spec.columns, where) for f in FIELDS}
    if chosen["messages"] is None and chosen["prompt"] is None:
        raise TaskError(f"{where}: no prompt or messages column (the columns are {sorted(row)}): name one in [tasks] "
                        "columns, e.g. columns = {{ prompt = \"question\" }}")
    if "prompt" in spec.columns and "messages" not in spec.columns:
        chosen["messages"] = None                      # the run chose the prompt column
    elif chosen["messages"] is not None:
        chosen["prompt"] = None
    task = {k: json.loads(json.dumps(v, default=str)) for k, v in row.items() if k not in chosen.values()}
    if chosen["messages"] is not None:
        messages = list(row[chosen["messages"]])
    else:
        messages = [{"role": "user", "content": str(row[chosen["prompt"]])}]
    if spec.system_prompt and not (messages and isinstance(messages[0], dict) and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": spec.system_prompt}, *messages]
    task["messages"] = messages
    task["id"] = str(row[chosen["id"]]) if chosen["id"] is not None else f"{name}-{spec.split}-{index}"
    if chosen["answer"] is not None:
        task["answer"] = str(row[chosen["answer"]])
    task["domain"] = str(row[chosen["domain"]]) if chosen["domain"] is not None else name
    return validate_task(task, where)


def dataset_tasks(spec: DatasetSpec, base_dir: Path | None = None) -> Iterator[tuple[dict[str, Any], str, str]]:
    """Each task of ``spec``'s split with where it is (``dataset [split] row N``, ``at row N``), up to ``limit``."""
    rows, name = _rows(spec, base_dir)
    try:
        index = 0
        while not spec.limit or index < spec.limit:
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as exc:          # what the datasets library raises while reading: a bad file, a schema
                raise TaskError(f"dataset {spec.dataset} [{spec.split}] row {index}: cannot read it: "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
            yield (row_task(row, index, spec, name), f"dataset {spec.dataset} [{spec.split}] row {index}",
                   f"at row {index}")
            index += 1
    finally:
        _close(rows)


def _close(rows: Iterator[dict[str, Any]]) -> None:
    """End a streamed split now, its Arrow scanner's threads with it: left to the interpreter's exit, they outlive
    Arrow's own teardown and the process aborts ("terminate called without an active exception"; apache/arrow#45214,
    huggingface/datasets#7357)."""
    close = getattr(rows, "close", None)
    if close is not None:
        close()
    gc.collect()
