"""Package discovery for the folder layout: everything else is declared in pyproject.toml.

Each code folder named in ``[tool.setuptools.package-dir]`` is installed under its package name (``app/`` as
``forge.app``), and every folder below it is a package of it by rule: a subfolder is a package where it holds Python
or data files (``forge/assets/tiny``, ``actors/engine/csrc``), whether or not it has an ``__init__.py``. Folders whose
names are not identifiers (``forge/assets/tiny-moe``) stay data of the package above them.
"""

import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
SKIPPED = {"__pycache__"}


def packages_under(package: str, folder: Path, roots: dict[str, str]) -> list[str]:
    found = [package]
    for child in sorted(folder.iterdir()):
        name = f"{package}.{child.name}"
        if child.is_dir() and child.name.isidentifier() and child.name not in SKIPPED and name not in roots:
            found += packages_under(name, child, roots)
    return found


def discovered() -> list[str]:
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return sorted(p for package, folder in roots.items() for p in packages_under(package, ROOT / folder, roots))


setup(packages=discovered())
