"""The import graph of the installed package ``forge``, read from the source (every import statement counts: at the
top of a module, inside a function, or under ``TYPE_CHECKING``), and the checks the layer contract makes of it:
imports that go up a floor or across rooms of one floor, the same inside the shared core between its layers, import
cycles, and functions over a length.

The contract itself is declared in pyproject.toml (``[tool.forge.layers]``): where each package's folder is comes
from ``[tool.setuptools.package-dir]``.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    importer: str           # module name
    imported: str           # module name (a package's ``__init__`` is the package's name)
    path: Path
    line: int


CORE = "forge"      # the floor room whose modules the core layers order


@dataclass(frozen=True)
class Contract:
    floors: tuple[tuple[str, ...], ...]          # rooms (package names), the top floor first
    max_function_lines: int
    core: tuple[tuple[str, ...], ...] = ()       # the shared core's rooms (modules, packages), its top layer first

    @classmethod
    def read(cls, pyproject: Path) -> Contract:
        table = tomllib.loads(pyproject.read_text())["tool"]["forge"]["layers"]
        return cls(tuple(tuple(floor) for floor in table["floors"]), int(table["max_function_lines"]),
                   tuple(tuple(layer) for layer in table.get("core", ())))

    def room(self, module: str) -> str:
        """The room ``module`` belongs to: the longest room name that is it or a package above it."""
        return _longest(self.floors, module, "the contract")

    def floor(self, room: str) -> int:
        """0 for the top floor."""
        return next(i for i, floor in enumerate(self.floors) if room in floor)

    def core_room(self, module: str) -> str:
        """The room of the core layers ``module`` (a module of the core) belongs to."""
        return _longest(self.core, module, "the core's layers")

    def core_layer(self, room: str) -> int:
        """0 for the core's top layer."""
        return next(i for i, layer in enumerate(self.core) if room in layer)


def _longest(levels: tuple[tuple[str, ...], ...], module: str, what: str) -> str:
    found = [r for level in levels for r in level if module == r or module.startswith(r + ".")]
    if not found:
        raise ValueError(f"{module} is in no room of {what}")
    return max(found, key=len)


def package_dirs(root: Path) -> dict[str, Path]:
    """Package name → folder, from pyproject.toml's ``package-dir`` (``forge`` itself included)."""
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in table.items()}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package by name, generated stubs aside."""
    dirs = package_dirs(root)
    found: dict[str, Path] = {}
    for package, folder in sorted(dirs.items(), key=lambda item: len(item[0])):
        for path in sorted(folder.rglob("*.py")):
            if "_pb2" in path.name or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            mapped = next((p for p in dirs if p != package and (name == p or name.startswith(p + "."))
                           and len(p) > len(package)), None)
            if mapped is None:                  # a folder mapped to a package of its own is read as that one
                found[name] = path
    return found


def imports(known: dict[str, Path]) -> Iterator[Import]:
    """Every import of a ``forge`` module by a ``forge`` module; relative imports are refused (the project imports
    absolutely)."""
    for importer, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    raise AssertionError(f"{path}:{node.lineno}: relative import (the project imports absolutely)")
                base = node.module or ""
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for name in dict.fromkeys(names):
                if name == "forge" or name.startswith("forge."):
                    yield Import(importer, _existing(name, known), path, node.lineno)


def _existing(name: str, known: dict[str, Path]) -> str:
    """``name``, or the nearest package above it that exists (``forge.v1.x_pb2`` → ``forge.v1``)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def layer_violations(contract: Contract, found: Iterable[Import]) -> list[str]:
    """Imports that go up a floor, or from one room into another of the same floor; inside the shared core, imports
    that go up a core layer or across rooms of one."""
    bad = []
    for each in found:
        here, there = contract.room(each.importer), contract.room(each.imported)
        if here == there == CORE and contract.core:
            here, there = contract.core_room(each.importer), contract.core_room(each.imported)
            level, name = contract.core_layer, "core layer"
        else:
            level, name = contract.floor, "floor"
        if here == there:
            continue
        up = level(there) < level(here)
        if up or level(there) == level(here):
            where = f"up a {name}" if up else f"across rooms of one {name}"
            bad.append(f"{each.path}:{each.line}: {each.importer} imports {each.imported} ({where}: {here} → {there})")
    return bad


def cycles(found: Iterable[Import]) -> list[list[str]]:
    """The import cycles: strongly connected sets of two modules or more (Tarjan's algorithm), each sorted."""
    graph: dict[str, set[str]] = {}
    for each in found:
        if each.importer != each.imported:
            graph.setdefault(each.importer, set()).add(each.imported)
            graph.setdefault(each.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(result)


def long_functions(paths: Iterable[Path], most: int) -> list[str]:
    """Functions and methods longer than ``most`` lines (decorators aside, the docstring included)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > most:
                    found.append(f"{path}:{node.lineno}: {node.name} has {length} lines (at most {most})")
    return found
