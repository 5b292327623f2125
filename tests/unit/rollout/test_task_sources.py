"""A team's own tasks: a JSONL file or a Python task source is checked line by line before anything starts, every
kind of bad task is an error naming its line (or index) and what is wrong; the train/eval split is seeded, disjoint
and never leaves a side empty; and the training stream reshuffles every pass, the same for the same seed."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from pathlib import Path

import pytest

from forge.rollout.tasks import source
from forge.rollout.tasks.source import (
    TaskError,
    TaskSet,
    load_task_set,
    python_tasks,
    read_jsonl,
    task_cycle,
    validate_task,
)

USER = {"role": "user", "content": "What is 2 + 2?"}


def task(task_id: str, **fields) -> dict:
    return {"id": task_id, "messages": [USER], **fields}


def write_jsonl(path: Path, lines: list) -> Path:
    """One line per item: a dict or list as JSON, a string as it is."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_a_jsonl_file_gives_its_tasks_with_every_field_kept_and_the_domain_filled_in(tmp_path):
    tools = [{"type": "function", "function": {"name": "add", "description": "adds",
                                               "parameters": {"type": "object", "properties": {}}}},
             {"type": "function", "function": {"name": "mul"}}]
    conversation = [{"role": "system", "content": "Be brief."}, USER,
                    {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "4"},
                    {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function",
                                                          "function": {"name": "mul", "arguments": "{}"}}]},
                    {"role": "developer", "content": ""}]
    path = write_jsonl(tmp_path / "tasks.jsonl", [
        task("a", answer="4", meta={"level": 2}), "", "   ",
        task("b", domain="math", tools=tools),
        {"id": "c", "messages": conversation, "tools": []},
    ])
    assert read_jsonl(path) == [task("a", answer="4", meta={"level": 2}, domain="default"),
                                task("b", domain="math", tools=tools),
                                {"id": "c", "messages": conversation, "tools": [], "domain": "default"}]
    assert read_jsonl(str(path))[0]["id"] == "a"


def test_a_byte_order_mark_at_the_start_of_the_file_is_allowed(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(task("a")).encode() + b"\r\n" + json.dumps(task("b")).encode())
    assert [t["id"] for t in read_jsonl(path)] == ["a", "b"]


def message(**fields) -> dict:
    return task("x", messages=[USER, fields])


def tool(**fields) -> dict:
    return task("x", tools=[{"type": "function", "function": {"name": "ok"}}, fields])


@pytest.mark.parametrize(("line", "reason"), [
    ('{"id": "a",', "invalid JSON: Expecting property name enclosed in double quotes (column 12)"),
    ("nope", "invalid JSON: Expecting value (column 1)"),
    ("[1, 2]", "a task must be an object, got list"),
    ('"a task"', "a task must be an object, got str"),
    ({"messages": [USER]}, "missing 'id'"),
    (task(3), "'id' must be a non-empty string, got 3"),
    (task(""), "'id' must be a non-empty string, got ''"),
    (task(None), "'id' must be a non-empty string, got None"),
    ({"id": "x"}, "missing 'messages'"),
    (task("x", messages=[]), "'messages' must be a non-empty list, got []"),
    (task("x", messages="hi"), "'messages' must be a non-empty list, got str"),
    (task("x", messages=[USER, "hi"]), "messages[1] must be an object, got str"),
    (task("x", messages=[{"content": "hi"}]),
     "messages[0].role must be one of system, developer, user, assistant, tool, got None"),
    (message(role="bot", content="hi"),
     "messages[1].role must be one of system, developer, user, assistant, tool, got 'bot'"),
    (task("x", messages=[{"role": "user"}]), "messages[0].content is missing (it must be a string)"),
    (message(role="user", content=3), "messages[1].content must be a string, got int"),
    (message(role="user", content=[{"type": "text", "text": "hi"}]), "messages[1].content must be a string, got list"),
    (message(role="tool", content=None), "messages[1].content must be a string, got null"),
    (message(role="assistant", content=None),
     "messages[1].content must be a string, or null with tool_calls, got null"),
    (message(role="assistant"), "messages[1].content is missing (it must be a string, or null with tool_calls)"),
    (message(role="user", content="hi", tool_calls=[{}]),
     "messages[1].tool_calls is only for assistant messages, not user"),
    (message(role="assistant", content=None, tool_calls=[]),
     "messages[1].tool_calls must be a non-empty list of objects"),
    (message(role="assistant", tool_calls=["call"]), "messages[1].tool_calls must be a non-empty list of objects"),
    (task("x", messages=[{"role": "system", "content": "Be brief."}]), "'messages' has no user message"),
    (task("x", domain=""), "'domain' must be a non-empty string, got ''"),
    (task("x", domain=7), "'domain' must be a non-empty string, got 7"),
    (task("x", tools={"name": "add"}), "'tools' must be a list, got dict"),
    (tool(name="add"), "tools[1].type must be 'function', got None"),
    (task("x", tools=["add"]), "tools[0] must be an object, got str"),
    (tool(type="function"), "tools[1].function must be an object, got null"),
    (tool(type="function", function={"description": "adds"}),
     "tools[1].function.name must be a non-empty string, got None"),
    (tool(type="function", function={"name": ""}), "tools[1].function.name must be a non-empty string, got ''"),
    (tool(type="function", function={"name": "ok"}), "tools[1].function.name 'ok' is already the name of tools[0]"),
    (tool(type="function", function={"name": "add", "description": 3}),
     "tools[1].function.description must be a string, got int"),
    (tool(type="function", function={"name": "add", "parameters": "{}"}),
     "tools[1].function.parameters must be an object (a JSON schema), got str"),
])
def test_a_bad_line_is_an_error_naming_its_line_and_what_is_wrong(tmp_path, line, reason):
    path = write_jsonl(tmp_path / "tasks.jsonl", [task("first"), "", line, task("last")])
    with pytest.raises(TaskError) as caught:
        read_jsonl(path)
    assert str(caught.value) == f"{path}:3: {reason}"
    assert isinstance(caught.value, ValueError)


def test_a_repeated_id_names_the_line_that_had_it_first(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [task("a"), task("b"), "", task("c"), task("b")])
    with pytest.raises(TaskError) as caught:
        read_jsonl(path)
    assert str(caught.value) == f"{path}:5: duplicate id 'b' (first on line 2)"


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(json.dumps(task("a")).encode() + b'\n{"id": "\xff"}\n')
    with pytest.raises(TaskError) as caught:
        read_jsonl(path)
    assert str(caught.value) == f"{path}:2: not UTF-8 text (byte 9 of the line)"


@pytest.mark.parametrize(("make", "reason"), [
    (lambda path: path.write_text(""), "no tasks in it (the file is empty)"),
    (lambda path: path.write_text("\n  \n\n"), "no tasks in it (the file is empty)"),
    (lambda path: None, "no such file"),
    (lambda path: path.mkdir(), "is a folder, not a JSONL file"),
])
def test_an_empty_missing_or_unreadable_file_is_an_error(tmp_path, make, reason):
    path = tmp_path / "tasks.jsonl"
    make(path)
    with pytest.raises(TaskError) as caught:
        read_jsonl(path)
    assert str(caught.value) == f"{path}: {reason}"


def test_validate_task_checks_one_task_without_changing_it():
    given = task("a", extra=[1])
    assert validate_task(given, "here") == {**given, "domain": "default"} and "domain" not in given
    with pytest.raises(TaskError, match=r"^here: missing 'messages'$"):
        validate_task({"id": "a"}, "here")


SOURCE = """
def tasks():
    for i in range(3):
        yield {"id": f"t{i}", "messages": [{"role": "user", "content": str(i)}], "domain": "gen" if i else "zero"}

def listed():
    return [{"id": "only", "messages": [{"role": "user", "content": "hi"}]}]

TASKS = [{"id": "constant", "messages": [{"role": "user", "content": "hi"}]}]
EMPTY = []
NUMBER = 3
def dict_returned():
    return {"id": "x", "messages": [{"role": "user", "content": "hi"}]}

def raises():
    raise LookupError("no tasks table\\nmore")

def breaks_midway():
    yield {"id": "a", "messages": [{"role": "user", "content": "hi"}]}
    raise OSError("disk gone")

def bad_second():
    return [{"id": "a", "messages": [{"role": "user", "content": "hi"}]}, {"id": "b", "messages": []}]

def duplicates():
    return [{"id": "a", "messages": [{"role": "user", "content": "hi"}]}] * 2

def endless():
    for i in __import__("itertools").count():
        yield {"id": str(i), "messages": [{"role": "user", "content": "hi"}]}
"""


@pytest.fixture
def source_file(tmp_path) -> Path:
    path = tmp_path / "my_tasks.py"
    path.write_text(SOURCE)
    return path


def test_a_python_source_gives_its_tasks_from_a_file_or_a_module(tmp_path, source_file, monkeypatch):
    assert [t["id"] for t in python_tasks("my_tasks.py:tasks", base_dir=tmp_path)] == ["t0", "t1", "t2"]
    assert python_tasks(f"{source_file}:listed") == [{"id": "only", "messages": [{"role": "user", "content": "hi"}],
                                                      "domain": "default"}]
    assert [t["id"] for t in python_tasks("my_tasks.py:TASKS", base_dir=tmp_path)] == ["constant"]
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [t["domain"] for t in python_tasks("my_tasks:tasks")] == ["zero", "gen", "gen"]


@pytest.mark.parametrize(("name", "reason"), [
    ("EMPTY", "task source 'my_tasks.py:EMPTY': no tasks"),
    ("NUMBER",
     "task source 'my_tasks.py:NUMBER' is neither a function returning tasks nor an iterable of them (got int)"),
    ("dict_returned", "task source 'my_tasks.py:dict_returned' returned no iterable of tasks (got dict)"),
    ("raises", "task source 'my_tasks.py:raises' raised LookupError: no tasks table"),
    ("breaks_midway", "task source 'my_tasks.py:breaks_midway' raised OSError: disk gone (at index 1)"),
    ("bad_second", "my_tasks.py:bad_second[1]: 'messages' must be a non-empty list, got []"),
    ("duplicates", "my_tasks.py:duplicates[1]: duplicate id 'a' (first at index 0)"),
    ("missing", "task source 'my_tasks.py:missing': file 'my_tasks.py' has no attribute 'missing'"),
])
def test_a_python_source_that_gives_no_valid_tasks_is_a_clear_error(tmp_path, source_file, name, reason):
    with pytest.raises(TaskError) as caught:
        python_tasks(f"my_tasks.py:{name}", base_dir=tmp_path)
    assert str(caught.value) == reason


def test_an_endless_python_source_is_refused_instead_of_hanging(tmp_path, source_file, monkeypatch):
    monkeypatch.setattr(source, "MAX_TASKS", 5)
    with pytest.raises(TaskError) as caught:
        python_tasks("my_tasks.py:endless", base_dir=tmp_path)
    assert str(caught.value) == "task source 'my_tasks.py:endless': more than 5 tasks (an endless generator?)"
    assert source.MAX_TASKS == 5 and len(python_tasks("my_tasks.py:tasks", base_dir=tmp_path)) == 3


def test_the_default_limit_is_a_million_tasks():
    assert source.MAX_TASKS == 1_000_000


def tasks_file(path: Path, ids, domain: str | None = None) -> Path:
    return write_jsonl(path, [task(i, **({"domain": domain} if domain else {})) for i in ids])


def test_a_task_set_loads_train_and_eval_files_relative_to_base_dir(tmp_path):
    tasks_file(tmp_path / "train.jsonl", ["a", "b", "c"], domain="math")
    (tmp_path / "data").mkdir()
    tasks_file(tmp_path / "data" / "eval.jsonl", ["x", "y"], domain="code")
    tasks = load_task_set(train="train.jsonl", eval="data/eval.jsonl", base_dir=tmp_path)
    assert [t["id"] for t in tasks.train] == ["a", "b", "c"] and [t["id"] for t in tasks.eval] == ["x", "y"]
    assert isinstance(tasks.train, tuple) and isinstance(tasks.eval, tuple)
    assert tasks.domains == ("code", "math")
    alone = load_task_set(train=str(tmp_path / "train.jsonl"))
    assert alone == TaskSet(train=tasks.train, eval=()) and alone.domains == ("math",)


def test_a_task_set_from_a_python_source(tmp_path, source_file):
    tasks = load_task_set(train=None, source="my_tasks.py:tasks", eval_fraction=0.5, base_dir=tmp_path)
    assert len(tasks.train) + len(tasks.eval) == 3 and tasks.train and tasks.eval
    assert tasks.domains == ("gen", "zero")


def test_the_eval_split_is_seeded_disjoint_and_never_leaves_a_side_empty(tmp_path):
    ids = [f"t{i:02}" for i in range(20)]
    path = tasks_file(tmp_path / "train.jsonl", ids)
    split = load_task_set(train=str(path), eval_fraction=0.25, seed=7)
    train, evaluation = [t["id"] for t in split.train], [t["id"] for t in split.eval]
    assert len(evaluation) == 5 and len(train) == 15
    assert not set(train) & set(evaluation) and sorted(train + evaluation) == ids
    assert train == sorted(train) and evaluation == sorted(evaluation)         # each side keeps the file's order
    assert load_task_set(train=str(path), eval_fraction=0.25, seed=7) == split
    assert load_task_set(train=str(path), eval_fraction=0.25, seed=8).eval != split.eval

    small = tasks_file(tmp_path / "small.jsonl", ["a", "b", "c"])
    assert [len(load_task_set(train=str(small), eval_fraction=f).eval) for f in (0.01, 0.5, 0.99)] == [1, 2, 2]
    pair = load_task_set(train=str(small), eval_fraction=0.0)
    assert pair.eval == () and len(pair.train) == 3


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"train": None}, "give the training tasks as one of train (a JSONL file), source (a Python task source) and "
                      "dataset"),
    ({"train": "train.jsonl", "source": "my_tasks.py:tasks"},
     "give the training tasks as one of train (a JSONL file), source (a Python task source) and dataset, not "
     "several"),
    ({"train": "train.jsonl", "eval": "eval.jsonl", "eval_fraction": 0.2},
     "give either eval (a JSONL file) or eval_fraction (a split of the training tasks), not both"),
    ({"train": "one.jsonl", "eval_fraction": 0.5},
     "eval_fraction 0.5 needs at least 2 tasks to split, the train set has 1"),
    ({"train": "train.jsonl", "eval": "overlap.jsonl"},
     "{base}/overlap.jsonl:2: id 'b' is also in the train set ({base}/train.jsonl:2)"),
    ({"train": "train.jsonl", "eval": "missing.jsonl"}, "{base}/missing.jsonl: no such file"),
    ({"train": "bad.jsonl"}, "{base}/bad.jsonl:1: missing 'messages'"),
    ({"train": None, "source": "my_tasks.py:nothing"},
     "task source 'my_tasks.py:nothing': file 'my_tasks.py' has no attribute 'nothing'"),
])
def test_a_task_set_that_cannot_be_used_is_a_clear_error(tmp_path, source_file, kwargs, reason):
    tasks_file(tmp_path / "train.jsonl", ["a", "b"])
    tasks_file(tmp_path / "eval.jsonl", ["x"])
    tasks_file(tmp_path / "overlap.jsonl", ["x", "b"])
    tasks_file(tmp_path / "one.jsonl", ["a"])
    write_jsonl(tmp_path / "bad.jsonl", [{"id": "a"}])
    with pytest.raises(TaskError) as caught:
        load_task_set(base_dir=tmp_path, **kwargs)
    assert str(caught.value) == reason.format(base=tmp_path)


@pytest.mark.parametrize("fraction", [1, 1.0, 1.5, -0.1, math.nan, True, "0.2"])
def test_an_eval_fraction_outside_zero_to_one_is_refused(tmp_path, fraction):
    path = tasks_file(tmp_path / "train.jsonl", ["a", "b"])
    with pytest.raises(TaskError) as caught:
        load_task_set(train=str(path), eval_fraction=fraction)
    assert str(caught.value) == ("eval_fraction must be a number from 0 (no split) up to, not including, 1; "
                                 f"got {fraction!r}")


def test_task_cycle_reshuffles_every_pass_the_same_way_for_a_seed():
    tasks = [task(f"t{i}") for i in range(10)]
    drawn = list(itertools.islice(task_cycle(tasks, seed=3), 50))
    passes = [[t["id"] for t in drawn[i:i + 10]] for i in range(0, 50, 10)]
    assert all(sorted(p) == sorted(t["id"] for t in tasks) for p in passes)    # every pass is every task once
    assert len({tuple(p) for p in passes}) > 1                                 # and not in one fixed order
    assert drawn == list(itertools.islice(task_cycle(tasks, seed=3), 50))
    assert drawn != list(itertools.islice(task_cycle(tasks, seed=4), 50))
    assert [t["id"] for t in tasks] == [f"t{i}" for i in range(10)]           # the caller's list is not shuffled
    assert [t["id"] for t in itertools.islice(task_cycle(tasks[:1], seed=0), 3)] == ["t0"] * 3
    with pytest.raises(ValueError, match="at least one task"):
        task_cycle([], seed=0)


def test_the_built_in_tasks_are_a_task_source_with_their_verifier():
    from forge.rollout.tasks import DOMAINS, eval_set, task_stream
    from forge.rollout.tasks.builtin_source import held_out
    from forge.rollout.verifier import load_verifier

    tasks = load_task_set(train=None, source="forge.rollout.tasks.builtin_source:train", eval_fraction=0.05, seed=1)
    assert tasks.domains == tuple(sorted(DOMAINS)) and len(tasks.train) + len(tasks.eval) == 3072
    first = next(task_stream(DOMAINS, 0))
    line = next(t for t in [*tasks.train, *tasks.eval] if t["id"] == first.task_id)
    assert line["messages"] == first.messages and line["answer"] == first.answer
    assert {t["id"] for t in held_out(4)} == {t.task_id for d in DOMAINS for t in eval_set(d, 4)}
    verifier = load_verifier("forge.rollout.tasks.builtin_source:score")
    try:
        right = asyncio.run(verifier.score(line, f"Answer: {line['answer']}", {}))
        wrong = asyncio.run(verifier.score(line, "Answer: nothing", {}))
    finally:
        verifier.close()
    assert right == {"correct": 1.0} and wrong == {"correct": 0.0}


def test_a_run_file_naming_a_module_by_its_name_before_the_move_loads_it():
    from forge.loading import PluginError, load_object
    from forge.rollout.tasks.builtin_source import train

    assert load_object("forge.tasks.builtin_source:train", what="task source") is train
    with pytest.raises(PluginError, match=r"cannot import module 'forge\.rollout\.tasks\.nothing'"):
        load_object("forge.tasks.nothing:train", what="task source")
