"""The programs start light: the ``forge`` command group (every command's options, ``forge up``'s plan of the
services) and the services' own programs import neither torch nor transformers until a command needs them, so a
command that refuses its input, prints help or supervises services answers in a fraction of the time and memory."""

from __future__ import annotations

import ast
import subprocess
import sys

PROGRAMS = ("forge.app.main", "forge.app.registry", "forge.actors.cli", "forge.learner.cli", "forge.cache.cli",
            "forge.rollout.cli", "forge.pool.cli")
HEAVY = ("torch", "transformers")


def heavy_modules_by_import(*names: str) -> dict[str, list[str]]:
    """Importing ``names`` in turn in a fresh interpreter: the heavy modules loaded once each was imported."""
    probe = (f"import sys\nfound = {{}}\nfor name in {names!r}:\n    __import__(name)\n"
             f"    found[name] = sorted(m for m in {HEAVY!r} if m in sys.modules)\nprint(found)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip())


def test_the_programs_import_no_torch_until_a_command_needs_it():
    assert heavy_modules_by_import(*PROGRAMS) == {program: [] for program in PROGRAMS}


def test_the_probe_sees_a_module_that_imports_torch():
    assert heavy_modules_by_import("forge.pool.cli", "forge.learner.losses") == {
        "forge.pool.cli": [], "forge.learner.losses": ["torch"]}
