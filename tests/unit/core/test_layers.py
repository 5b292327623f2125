"""The layer contract (pyproject.toml's ``[tool.forge.layers]``, docs/design.md's code map): entry points above the
services above the shared core, no service importing another, the shared core's own layers (``core``) kept the same
way with no click below its command-line helpers, no import cycle, no function over its length limit,
and no environment variable read that forge.variables does not declare. Imports inside functions and under
TYPE_CHECKING count."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from forge.variables import VARIABLES

from conftest import REPO
from helpers.import_graph import (
    CORE,
    Contract,
    cycles,
    imports,
    layer_violations,
    long_functions,
    modules,
    package_dirs,
)

CONTRACT = Contract.read(REPO / "pyproject.toml")
MODULES = modules(REPO)
IMPORTS = list(imports(MODULES))
# The settings' own machinery reads the variables every setting declares (FORGE_<COMMAND>_<OPTION>).
READS_SETTINGS_VARIABLES = {"forge.cli.options", "forge.variables"}


def test_every_module_is_in_a_room():
    assert {CONTRACT.room(name) for name in MODULES} == {room for floor in CONTRACT.floors for room in floor}


def test_every_core_module_is_in_a_declared_layer():
    """A new core module or package is placed in a layer of its own choosing, not left in forge's own room."""
    core = [name for name in MODULES if CONTRACT.room(name) == CORE]
    assert [name for name in core if name != CORE and CONTRACT.core_room(name) == CORE] == []
    declared = {room for layer in CONTRACT.core for room in layer}
    assert declared - {CONTRACT.core_room(name) for name in core} == set()      # no room that holds nothing


def test_no_import_goes_up_a_floor_or_across_rooms():
    assert layer_violations(CONTRACT, IMPORTS) == []


def test_there_is_no_import_cycle():
    assert cycles(IMPORTS) == []


def test_no_function_is_longer_than_the_limit():
    assert long_functions(MODULES.values(), CONTRACT.max_function_lines) == []


def click_imports(known: dict[str, Path], contract: Contract) -> list[str]:
    """Core modules below the command-line helpers (the layer of ``forge.cli``) that import click."""
    cli = contract.core_layer("forge.cli")
    found = []
    for name, path in known.items():
        if contract.room(name) != CORE or contract.core_layer(contract.core_room(name)) <= cli:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "click" or n.startswith("click.") for n in names):
                found.append(f"{path}:{node.lineno}: {name} imports click")
    return found


def test_no_click_below_the_command_line_helpers():
    assert click_imports(MODULES, CONTRACT) == []


def environment_reads(path: Path) -> list[int]:
    """Lines of ``path`` that read one variable of the environment (``os.environ[...]``, ``.get``, ``in``,
    ``os.getenv``); copying the whole environment for a child process is not a read of one variable."""
    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
            and node.value.id == "os"

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load)) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                (node.func.attr in ("get", "setdefault", "pop") and is_environ(node.func.value))
                or (node.func.attr == "getenv" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "os"))) or (isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators)):
            found.append(node.lineno)
    return found


def test_the_environment_is_read_through_its_declarations():
    reads = [f"{path}:{line}" for name, path in MODULES.items() if name not in READS_SETTINGS_VARIABLES
             for line in environment_reads(path)]
    assert reads == [], "read declared variables with forge.variables.read"


# The checks see what they must: each is shown failing on a planted breach.

def planted(tmp_path: Path, files: dict[str, str]) -> Path:
    """A copy of the repository's pyproject.toml beside the given source files."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for folder in package_dirs(tmp_path).values():
        init = folder / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")
    return tmp_path


def test_the_contract_sees_an_upward_import_inside_a_function(tmp_path):
    root = planted(tmp_path, {
        "forge/pool.py": "def f():\n    from forge.gateway.errors import GatewayError\n    return GatewayError\n",
        "gateway/errors.py": "from forge.pool import f\nclass GatewayError(Exception): ...\n",
        "learner/train.py": "import forge.actors.engine\n",
        "actors/engine.py": "from forge.app.main import forge\n",
        "app/main.py": "import forge.cache\nforge = 1\n"})
    found = list(imports(modules(root)))
    bad = layer_violations(CONTRACT, found)
    assert any("forge.pool imports forge.gateway.errors (up a floor" in b for b in bad), bad
    assert any("forge.learner.train imports forge.actors.engine (across rooms" in b for b in bad), bad
    assert any("forge.actors.engine imports forge.app.main (up a floor" in b for b in bad), bad
    assert not any("forge.app.main" in b.split(" imports ")[0] for b in bad)         # the app floor may import down
    assert cycles(found) == [["forge.gateway.errors", "forge.pool"]]


def test_the_contract_sees_an_upward_import_inside_the_core(tmp_path):
    root = planted(tmp_path, {
        "forge/settings.py": "def f():\n    from forge.pool import Pool\n    return Pool\n",
        "forge/pool/__init__.py": "from forge.settings import f\nclass Pool: ...\n",
        "forge/kv/client.py": "import forge.weights.publisher\n",
        "forge/weights/publisher.py": "import forge.sampling.grammar\n",
        "forge/sampling/grammar.py": "import forge.v1\n",
        "protos/forge/v1/__init__.py": "",
        "forge/model/qwen3.py": "def f():\n    from forge.app.main import forge\n    return forge\n",
        "forge/tokenizer/tokenizer.py": "from forge.rollout.tasks import ALL\n",
        "forge/newcomer.py": "import forge.v1\n",
        "app/main.py": "forge = 1\n",
        "rollout/tasks.py": "ALL = ()\n"})
    known = modules(root)
    bad = layer_violations(CONTRACT, list(imports(known)))
    assert any("forge.settings imports forge.pool (up a core layer: forge.settings → forge.pool)" in b
               for b in bad), bad
    assert any("forge.kv.client imports forge.weights.publisher (across rooms of one core layer" in b for b in bad), bad
    assert any("forge.model.qwen3 imports forge.app.main (up a floor: forge → forge.app)" in b for b in bad), bad
    assert any("forge.tokenizer.tokenizer imports forge.rollout.tasks (up a floor: forge → forge.rollout)" in b
               for b in bad), bad
    assert not any(b.split(": ", 1)[1].startswith(("forge.pool ", "forge.weights", "forge.sampling")) for b in bad)
    assert CONTRACT.core_room("forge.newcomer") == CORE          # undeclared: left in forge's own room, seen above


def test_the_click_check_sees_click_below_the_command_line_helpers(tmp_path):
    root = planted(tmp_path, {
        "forge/model/command.py": "def main():\n    import click\n    return click\n",
        "forge/cli/options.py": "import click\n",
        "forge/pool/cli.py": "from click import command\n"})
    found = click_imports(modules(root), CONTRACT)
    assert [f.split(": ", 1)[1] for f in found] == ["forge.model.command imports click"]


def test_the_function_check_sees_a_long_function(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n" + "    x = 1\n" * 100)
    assert long_functions([source], 100) == [f"{source}:1: f has 101 lines (at most 100)"]
    source.write_text("def f():\n" + "    x = 1\n" * 99)
    assert long_functions([source], 100) == []


def test_the_environment_check_sees_a_read(tmp_path):
    source = tmp_path / "reads.py"
    source.write_text("import os\na = os.environ['A']\nb = os.environ.get('B')\nc = 'C' in os.environ\n"
                      "d = os.getenv('D')\nenv = {**os.environ}\nos.environ['E'] = '1'\n")
    assert environment_reads(source) == [2, 3, 4, 5]


def test_every_declared_variable_is_documented():
    documented = (REPO / "docs" / "config.md").read_text()
    assert [name for name in VARIABLES if f"`{name}`" not in documented] == []
