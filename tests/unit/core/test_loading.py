"""``load_object``, the one way Forge loads user code named in a run file: a module spec is imported, a file spec is
loaded from its path (relative to the run file's folder or the current directory) with its siblings importable, and
every spec that names nothing usable is a one-line ``PluginError`` saying why."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from forge.loading import PluginError, load_object


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_module_spec_is_imported():
    assert load_object("json:dumps", what="verifier") is json.dumps
    assert load_object("forge.loading:load_object", what="verifier") is load_object


def test_a_file_spec_is_loaded_relative_to_base_dir_with_its_siblings_importable(tmp_path):
    write(tmp_path, "plugins/loading_sibling_a.py", "FACTOR = 3\n")
    write(tmp_path, "plugins/scoring.py", "from dataclasses import dataclass\n\nimport loading_sibling_a\n\n\n"
                                          "@dataclass\nclass Point:\n    x: int\n\n\n"
                                          "def score(value):\n    return Point(value * loading_sibling_a.FACTOR)\n")
    path_before = list(sys.path)
    score = load_object("plugins/scoring.py:score", what="verifier", base_dir=tmp_path)
    assert score(2).x == 6                                 # a dataclass needs its module in sys.modules
    assert sys.path == path_before                         # the file's folder was on sys.path only while it loaded
    assert load_object(f"{tmp_path}/plugins/scoring.py:score", what="verifier", base_dir=Path("/nowhere"))(1).x == 3


def test_a_relative_file_spec_without_base_dir_is_relative_to_the_current_directory(tmp_path, monkeypatch):
    write(tmp_path, "tasks.py", "TASKS = ['here']\n")
    monkeypatch.chdir(tmp_path)
    assert load_object("tasks.py:TASKS", what="task source") == ["here"]


def test_every_load_of_a_file_is_a_module_of_its_own(tmp_path):
    write(tmp_path, "a/tasks.py", "NAME = 'a'\n")
    write(tmp_path, "b/tasks.py", "NAME = 'b'\n")
    first = load_object("a/tasks.py:NAME", what="task source", base_dir=tmp_path)
    second = load_object("b/tasks.py:NAME", what="task source", base_dir=tmp_path)
    assert (first, second) == ("a", "b")
    write(tmp_path, "a/tasks.py", "NAME = 'a again'\n")
    assert load_object("a/tasks.py:NAME", what="task source", base_dir=tmp_path) == "a again"


@pytest.mark.parametrize(("spec", "reason"), [
    ("json.dumps", "expected package.module:name or path/to/file.py:name (there is no colon)"),
    (":score", "the module or file before the colon is empty"),
    ("json:", "the name after the colon is empty"),
    ("no_such_package_xyz.scoring:score",
     "cannot import module 'no_such_package_xyz.scoring': ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    ("json:no_such_name", "module 'json' has no attribute 'no_such_name'"),
])
def test_a_spec_that_names_nothing_usable_is_a_one_line_error(spec, reason):
    with pytest.raises(PluginError) as caught:
        load_object(spec, what="verifier")
    assert str(caught.value) == f"verifier {spec!r}: {reason}"
    assert (caught.value.what, caught.value.spec, caught.value.reason) == ("verifier", spec, reason)
    assert isinstance(caught.value, ValueError)


def test_file_errors_name_the_file(tmp_path):
    write(tmp_path, "ok.py", "X = 1\n")
    (tmp_path / "folder.py").mkdir()
    write(tmp_path, "notes.txt", "X = 1\n")
    cases = {
        "missing.py:score": f"file {str(tmp_path / 'missing.py')!r} does not exist",
        "folder.py:score": f"{str(tmp_path / 'folder.py')!r} is not a .py file",
        "./notes.txt:score": f"{str(tmp_path / 'notes.txt')!r} is not a .py file",
        "ok.py:score": "file 'ok.py' has no attribute 'score'",
    }
    for spec, reason in cases.items():
        with pytest.raises(PluginError) as caught:
            load_object(spec, what="agent", base_dir=tmp_path)
        assert str(caught.value) == f"agent {spec!r}: {reason}"


@pytest.mark.parametrize(("name", "code", "reason"), [
    ("loading_raises", "raise RuntimeError('the scorer broke\\nsecond line')\n", "RuntimeError: the scorer broke"),
    ("loading_imports", "import no_such_module_xyz\n", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("loading_syntax", "def broken(:\n", "SyntaxError: invalid syntax (loading_syntax.py, line 1)"),
    ("loading_exits", "import sys\nsys.exit(3)\n", "SystemExit: 3"),
    ("loading_bare", "raise KeyError\n", "KeyError"),
])
def test_a_module_or_file_that_fails_to_import_says_which_exception_and_its_first_line(tmp_path, monkeypatch, name,
                                                                                         code, reason):
    path = write(tmp_path, f"{name}.py", code)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as caught:
        load_object(f"{name}:score", what="verifier")
    assert str(caught.value) == f"verifier '{name}:score': cannot import module {name!r}: {reason}"

    path_before, modules_before = list(sys.path), set(sys.modules)
    with pytest.raises(PluginError) as caught:
        load_object(f"{path}:score", what="verifier")
    assert str(caught.value) == f"verifier '{path}:score': cannot import {str(path)!r}: {reason}"
    assert sys.path == path_before and set(sys.modules) <= modules_before      # nothing left behind


def test_router_class_loads_a_router_from_a_file_too(tmp_path, monkeypatch):
    from forge.gateway.routing import RoundRobinRouter, router_class

    write(tmp_path, "my_routers.py", "from forge.gateway.routing import RoundRobinRouter\n\n\n"
                                     "class Mine(RoundRobinRouter):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    found = router_class("my_routers.py:Mine")
    assert issubclass(found, RoundRobinRouter) and found.__name__ == "Mine"
    with pytest.raises(PluginError) as caught:
        router_class("my_routers.py:Missing")
    assert str(caught.value) == "router 'my_routers.py:Missing': file 'my_routers.py' has no attribute 'Missing'"
