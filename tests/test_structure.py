"""The rooms' one-way dependencies: the gateway and the learner meet only in the shared core (the Data Pool), never
in each other; the pool depends on neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

FORBIDDEN = {
    "learner": ("forge.gateway",),
    "gateway": ("forge.learner",),
    "forge/pool": ("forge.gateway", "forge.learner"),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute names; relative imports are resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: relative import (the project imports absolutely)")
            found.append((node.lineno, node.module or ""))
    return found


def violations(root: Path, room: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((root / room).rglob("*.py")):
        for line, module in imported_modules(path):
            if any(module == prefix or module.startswith(prefix + ".") for prefix in forbidden):
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_do_not_import_each_other(room: str) -> None:
    assert (REPO / room).is_dir()
    assert violations(REPO, room, FORBIDDEN[room]) == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "learner" / "bad.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from forge.gateway.errors import GatewayError\n    return GatewayError\n")
    (module.parent / "fine.py").write_text("import forge.gateway_like\nfrom forge.pool import Pool\n")
    assert violations(tmp_path, "learner", FORBIDDEN["learner"]) == ["learner/bad.py:2 imports forge.gateway.errors"]
