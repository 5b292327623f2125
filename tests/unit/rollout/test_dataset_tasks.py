"""Tasks from a dataset ([tasks] dataset): a local parquet file, a folder of splits, one task a row with its columns
mapped to the task's fields and the others kept; a limit reads only that many rows; bad input refused in one line
naming the row or the setting."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forge.rollout.config import TasksConfig
from forge.rollout.tasks.dataset_source import DatasetSpec, dataset_tasks, is_hub_id
from forge.rollout.tasks.source import TaskError, load_task_set
from forge.settings import SettingsError, build


def parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


ROWS = [{"question": f"What is {i} + {i}?", "answer": 2 * i, "level": i % 3} for i in range(10)]


def test_a_parquet_file_reads_as_tasks_one_a_row(tmp_path):
    parquet(tmp_path / "sums.parquet", ROWS)
    tasks = load_task_set(train=None, dataset=DatasetSpec("sums.parquet"), base_dir=tmp_path)
    assert len(tasks.train) == 10 and tasks.eval == ()
    first = tasks.train[0]
    assert first["messages"] == [{"role": "user", "content": "What is 0 + 0?"}]
    assert (first["id"], first["answer"], first["domain"], first["level"]) == ("sums-train-0", "0", "sums", 0)
    assert "question" not in first                         # the prompt column became the message


def test_columns_a_system_prompt_and_a_limit(tmp_path):
    rows = [{"uid": f"u{i}", "q": f"Say {i}.", "gold": str(i), "topic": "count"} for i in range(50)]
    parquet(tmp_path / "data.parquet", rows)
    spec = DatasetSpec(str(tmp_path / "data.parquet"), columns={"id": "uid", "prompt": "q", "answer": "gold",
                                                                 "domain": "topic"},
                       system_prompt="Answer with a number.", limit=7)
    tasks = [task for task, _, _ in dataset_tasks(spec)]
    assert [t["id"] for t in tasks] == [f"u{i}" for i in range(7)]
    assert tasks[3]["messages"] == [{"role": "system", "content": "Answer with a number."},
                                    {"role": "user", "content": "Say 3."}]
    assert (tasks[3]["answer"], tasks[3]["domain"]) == ("3", "count")


def test_a_folder_of_splits_gives_train_and_held_out_tasks(tmp_path):
    chats = [{"id": f"chat-{i}", "messages": [{"role": "user", "content": f"hi {i}"}], "answer": "x"} for i in range(4)]
    parquet(tmp_path / "data" / "train.parquet", chats)
    parquet(tmp_path / "data" / "test.parquet", [{**c, "id": f"held-{i}"} for i, c in enumerate(chats[:2])])
    parquet(tmp_path / "odd" / "train.parquet", chats)
    parquet(tmp_path / "odd" / "test.parquet", [{"other": 1}])
    with pytest.raises(TaskError, match=r"dataset odd \[test\] row 0: cannot read it: CastError"):
        load_task_set(train=None, dataset=DatasetSpec("odd"), eval_dataset=DatasetSpec("odd", "test"),
                      base_dir=tmp_path)
    config = build(TasksConfig, {"dataset": "data", "dataset_eval_split": "test", "verifier": "v.py:score"})
    tasks = load_task_set(train=None, dataset=config.dataset_spec(), eval_dataset=config.dataset_spec("test"),
                          base_dir=tmp_path)
    assert [t["id"] for t in tasks.train] == [f"chat-{i}" for i in range(4)]
    assert [t["id"] for t in tasks.eval] == ["held-0", "held-1"]
    assert tasks.train[1]["messages"] == [{"role": "user", "content": "hi 1"}]


@pytest.mark.parametrize(("spec", "message"), [
    (DatasetSpec("nothing/here.parquet"), "no such file or folder, and not a Hugging Face dataset id"),
    (DatasetSpec("sums.parquet", columns={"prompt": "prompt_text"}), "row 0: no column 'prompt_text' (for prompt)"),
    (DatasetSpec("plain.parquet"), "row 0: no prompt or messages column (the columns are ['a', 'b'])"),
    (DatasetSpec("folder", split="validation"), "dataset folder: "),
])
def test_bad_datasets_are_refused_in_one_line(tmp_path, spec, message):
    parquet(tmp_path / "sums.parquet", ROWS)
    parquet(tmp_path / "plain.parquet", [{"a": 1, "b": 2}])
    parquet(tmp_path / "folder" / "train.parquet", ROWS)
    with pytest.raises(TaskError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_task_set(train=None, dataset=spec, base_dir=tmp_path)


@pytest.mark.parametrize(("values", "message"), [
    ({"dataset": "org/name", "tasks": "t.jsonl"}, "give one of --tasks, --task-source and --dataset"),
    ({"dataset": "org/name", "dataset_eval_split": "test", "eval_fraction": 0.1}, "give one of --eval-tasks"),
    ({"dataset_eval_split": "test", "tasks": "t.jsonl"}, "--dataset-eval-split is a split of the dataset"),
    ({"dataset": "org/name", "dataset_columns": {"question": "q"}}, "columns names a field Forge does not read"),
    ({"dataset": "org/name", "dataset_eval_split": "train"}, "is the training split too"),
])
def test_dataset_settings_that_contradict_are_refused(values, message):
    with pytest.raises(SettingsError, match=message):
        build(TasksConfig, {"verifier": "v.py:score", **values})


def test_hub_ids_and_paths_are_told_apart():
    assert is_hub_id("openai/gsm8k") and is_hub_id("org/name@v1.0") and is_hub_id("org/name@refs/pr/3")
    assert not is_hub_id("./data/x") and not is_hub_id("/abs/path") and not is_hub_id("file.parquet")
    assert not is_hub_id("a/b/c")
