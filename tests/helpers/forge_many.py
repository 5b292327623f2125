"""``forge`` run once per command line, one after another in this one process, for checks of many commands that each
end before starting anything (refusals): Python's, Forge's and the environments' imports are paid once, not once per
command. Each runs as the ``forge`` program runs it (the same click group, ``FORGE_*`` variables read, its usage
errors printed and turned into the exit status), in a working directory of its own. Arguments: COMMANDS OUT, COMMANDS
a JSON file of a list of {"args": [...], "cwd": "..."}; OUT gets a JSON list of {"returncode", "stdout", "stderr"}
in the same order."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]                     # as the forge program's: the helpers' modules are not importable
from forge.app.main import forge


def run(args: list[str], cwd: str) -> dict:
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
    results = [run(command["args"], command["cwd"]) for command in json.loads(Path(commands).read_text())]
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
