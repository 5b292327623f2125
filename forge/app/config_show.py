"""``forge config show COMMAND``: the settings a service would run with, and where each came from (flag,
environment, run file, default), printed as the command's TOML table so it can be pasted into a run file."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from forge.cli.options import CONTEXT_SETTINGS, SettingsCommand, envvars_of, field_value, sources
from forge.settings import SettingsError, build, entries

SERVICES = ("learner", "actor", "gateway", "cache", "pool", "up", "rollout", "deploy")


def settings_commands() -> dict[str, SettingsCommand]:
    """Every command whose options are derived from settings, by the name of its run-file table."""
    from forge.actors.cli import actor
    from forge.app.deploy.cli import deploy
    from forge.app.rollout.cli import rollout
    from forge.app.up import up
    from forge.cache.cli import cache
    from forge.gateway.cli import gateway
    from forge.learner.cli import learner
    from forge.pool.cli import serve_command

    return {"learner": learner, "actor": actor, "gateway": gateway, "cache": cache, "pool": serve_command, "up": up,
            "rollout": rollout, "deploy": deploy}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


@click.group("config", context_settings=CONTEXT_SETTINGS)
def config_group() -> None:
    """Inspect the settings of Forge's services."""


@config_group.command("show")
@click.argument("command", type=click.Choice(SERVICES))
@click.option("--config", "run_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The run file the command would be given with --config.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def show(command: str, run_file: str | None, as_json: bool) -> None:
    """Print every setting of COMMAND (learner, actor, gateway, cache, pool, up, rollout, deploy) with its effective value
    and its source, reading the FORGE_<COMMAND>_* environment and the run file as the command itself would.
    Secrets show as ***."""
    target = settings_commands()[command]
    values, where = sources(target, ["--config", run_file] if run_file else [])
    rows = []
    for entry in entries(target.settings_class):
        value = values.get(entry.name)
        shown = "***" if entry.spec.secret and value not in (None, ()) else value
        rows.append({"name": entry.name, "value": shown, "source": where.get(entry.name, "default"),
                     "env": " or ".join(envvars_of(entry, target.settings_table)), "flag": entry.flag, "help": entry.spec.help})
    problem = None
    try:
        build(target.settings_class, {e.name: field_value(e, values.get(e.name)) for e in entries(target.settings_class)
                                      if e.name in values})
    except SettingsError as exc:
        problem = str(exc)
    if as_json:
        click.echo(json.dumps({"command": command, "table": target.settings_table, "settings": rows,
                               "error": problem}, indent=2, default=str))
    else:
        click.echo(f"[{target.settings_table}]")
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            value = r["value"]
            line = f"# {r['name']} is unset" if value is None else f"{r['name']} = {_toml(value)}"
            click.echo(f"{line:<{width + 24}} # {r['source']} ({r['flag']}, {r['env']})")
    if problem:
        click.echo(f"forge {command} would refuse these settings: {problem}", err=True)
        sys.exit(2)

