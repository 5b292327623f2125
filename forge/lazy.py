"""Packages whose names are imported when first used, not with the package: a process that reads one plain module
of a package (a configuration dataclass, key files) does not pay for the heavy imports of its other modules (torch
costs each process seconds of start-up and a few hundred megabytes). A package declares where each of its names
lives and hands ``lazy_exports``' two functions to Python as its module ``__getattr__`` and ``__dir__``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` whose name ``N`` lives in its module ``homes[N]``."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
