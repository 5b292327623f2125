"""The one way Forge loads user code that a run file or a flag names: ``package.module:attribute`` (an importable
module) or ``path/to/file.py:attribute`` (a file, relative to the run file's folder or the current directory).
Whatever goes wrong is a ``PluginError`` with one line saying what and why."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
import sys
from pathlib import Path
from typing import Any

_loaded = itertools.count()
# Modules that moved, by their old names: a run file written before the move names the same code.
RENAMED_MODULES = {"forge.tasks": "forge.rollout.tasks", "forge.sandbox": "forge.rollout.sandbox",
                   "forge.app.rollout": "forge.rollout"}


class PluginError(ValueError):
    """A spec that names nothing usable: ``str()`` is ``"{what} {spec!r}: {reason}"``."""

    def __init__(self, what: str, spec: str, reason: str) -> None:
        super().__init__(f"{what} {spec!r}: {reason}")
        self.what = what
        self.spec = spec
        self.reason = reason


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (just ``Type`` when the message is empty)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def load_object(spec: str, *, what: str, base_dir: Path | None = None) -> Any:
    """The attribute ``spec`` names: ``package.module:attribute`` is imported; ``path/to/file.py:attribute`` is
    loaded from that file (relative to ``base_dir``, else the current directory) as a module of its own, with the
    file's folder on ``sys.path`` while it loads so that it can import its siblings. ``what`` names the thing in
    errors ("verifier", "task source")."""
    target, colon, attribute = spec.rpartition(":")
    if not colon:
        raise PluginError(what, spec, "expected package.module:name or path/to/file.py:name (there is no colon)")
    if not target:
        raise PluginError(what, spec, "the module or file before the colon is empty")
    if not attribute:
        raise PluginError(what, spec, "the name after the colon is empty")
    if target.endswith(".py") or "/" in target:          # a file, not a module
        module = _load_file(spec, what, target, base_dir)
        where = f"file {target!r}"
    else:
        target = current_module_name(target)
        try:
            module = importlib.import_module(target)
        except (Exception, SystemExit) as exc:       # whatever the import raised, the spec names nothing usable
            raise PluginError(what, spec, f"cannot import module {target!r}: {first_line(exc)}") from exc
        where = f"module {target!r}"
    missing = object()
    found = getattr(module, attribute, missing)
    if found is missing:
        raise PluginError(what, spec, f"{where} has no attribute {attribute!r}")
    return found


def current_module_name(name: str) -> str:
    """``name``, or where the module it names lives now if it moved."""
    for old, new in RENAMED_MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return name


def _load_file(spec: str, what: str, target: str, base_dir: Path | None) -> Any:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = (base_dir if base_dir is not None else Path.cwd()) / path
    if not path.exists():
        raise PluginError(what, spec, f"file {str(path)!r} does not exist")
    if not path.is_file() or path.suffix != ".py":
        raise PluginError(what, spec, f"{str(path)!r} is not a .py file")
    # A name of its own for every load: two files called tasks.py never share (or replace) one module.
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_forge_plugin_{next(_loaded)}_{stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(what, spec, f"cannot load {str(path)!r} as Python")
    module = importlib.util.module_from_spec(module_spec)
    folder = str(path.parent)
    sys.modules[name] = module                       # dataclasses and pickle look a module up by its name
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise PluginError(what, spec, f"cannot import {str(path)!r}: {first_line(exc)}") from exc
    finally:
        if folder in sys.path:                       # unless the module took it off itself
            sys.path.remove(folder)
    return module
