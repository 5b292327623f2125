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


def test_the_forge_group_imports_a_command_when_it_runs():
    """``forge`` loads a command's module when that command is looked up: ``forge sandbox exec`` (run inside
    episodes, once per command of an agent) and ``forge rollout`` do not pay for ``forge up``'s imports; every
    command's name is the one it is listed under."""
    probe = ("import sys\nfrom forge.app.main import forge\nbefore = 'forge.app.up.cli' in sys.modules\n"
             "forge.get_command(None, 'sandbox')\nforge.get_command(None, 'rollout')\n"
             "print(before, 'forge.app.up.cli' in sys.modules, 'forge.app.sandbox_cli' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"]
    from forge.app.main import NAMES, forge

    assert sorted(forge.list_commands(None)) == sorted(NAMES)
    assert {name: command.name for name, command in forge.commands.items()} == {name: name for name in NAMES}
    assert forge.get_command(None, "no-such-command") is None
