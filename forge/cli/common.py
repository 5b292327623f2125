"""What every Forge command shares: logging set-up, the ``--config`` file option, and entry points that read
``FORGE_*`` environment variables.

Where an option's value comes from, highest first: the command line, the environment (``FORGE_<COMMAND>_<OPTION>``,
e.g. ``FORGE_ACTOR_PORT``), the config file (a TOML table named after the command, e.g. ``[actor]``), the default.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def _load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if not value:
        return value
    try:
        data = tomllib.loads(Path(value).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {value}: {exc}") from exc
    section = data.get(ctx.info_name.removeprefix("forge-"), data) if ctx.info_name else data
    if not isinstance(section, dict):
        raise click.BadParameter(f"{value}: [{ctx.info_name}] must be a table")
    ctx.default_map = {**(ctx.default_map or {}), **{k.replace("-", "_"): v for k, v in section.items()}}
    return value


def config_option(func: Callable) -> Callable:
    return click.option(
        "--config", type=click.Path(exists=True, dir_okay=False), is_eager=True, expose_value=False,
        callback=_load_config,
        help="TOML file with option defaults, in a table named after the command (e.g. [actor] port = 50051).",
    )(func)


def log_level_option(func: Callable) -> Callable:
    return click.option(
        "--log-level", default="INFO", show_default=True,
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        help="Logging verbosity (logs go to stderr).",
    )(func)


def entry_point(command: click.Command, name: str) -> Callable[[], Any]:
    """A console-script entry point for ``command`` that reads ``FORGE_<NAME>_*`` environment variables."""
    prefix = "FORGE_" + name.upper().replace("-", "_")

    def main() -> Any:
        return command.main(prog_name=f"forge-{name}", auto_envvar_prefix=prefix)

    return main


def write_ready_file(path: Path, **fields: object) -> None:
    """Announce a started service (its addresses, pid, …) as JSON, atomically: readers never see half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({**fields, "pid": os.getpid()}))
    os.replace(temporary, path)
