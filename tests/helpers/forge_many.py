"""``forge`` run once per command line, one after another in one process, for checks of several commands that each
end quickly (refusals, checks): Python's, Forge's and the environments' imports are paid once, not once per command.
Each runs as the ``forge`` program runs it (the same click group, ``FORGE_*`` variables read, its usage errors printed
and turned into the exit status, an uncaught exception's traceback on standard error and exit status 1), in a working
directory of its own. ``forge_commands`` runs this file as a program: COMMANDS OUT, COMMANDS a JSON file of a list of
{"args": [...], "cwd": "..."}; OUT gets a JSON list of {"returncode", "stdout", "stderr"} in the same order."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path


def forge_commands(commands: list[tuple[list[str], Path]], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """How each ``forge ARGS`` of ``commands`` (args, working directory) ended, as its own process would have, all
    run in one process; the files it needs are kept in the first command's working directory."""
    folder = commands[0][1]
    listed, out = folder / "forge-commands.json", folder / "forge-results.json"
    listed.write_text(json.dumps([{"args": args, "cwd": str(cwd)} for args, cwd in commands]))
    done = subprocess.run([sys.executable, __file__, str(listed), str(out)], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0 and out.exists(), done.stdout[-2000:] + done.stderr[-3000:]
    return [subprocess.CompletedProcess(["forge", *args], r["returncode"], r["stdout"], r["stderr"])
            for (args, _), r in zip(commands, json.loads(out.read_text()), strict=True)]


def _run(forge, args: list[str], cwd: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            forge.main(args=args, prog_name="forge", auto_envvar_prefix="FORGE")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:                   # what the program would print as it died
        code = 1
        err.write(traceback.format_exc())
    finally:
        os.chdir(here)
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main(commands: str, out: str) -> None:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]                 # as the forge program's: the helpers' modules are not importable
    from forge.app.main import forge

    results = [_run(forge, command["args"], command["cwd"]) for command in json.loads(Path(commands).read_text())]
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
