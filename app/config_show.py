"""``forge config show COMMAND``: the settings a command would run with, and where each came from (flag,
environment, run file, default), printed as the command's TOML table so it can be pasted into a run file. For
``forge up``, the settings of every service it starts follow its own, each with its source: the service's default,
the main job's tuning (``forge up``), the run file, the environment, ``--set``, or forge up's wiring."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from forge.app.deploy.cli import deploy
from forge.app.registry import SERVICES
from forge.app.up.cli import services_from, up
from forge.app.up.config import UpConfig
from forge.app.up.plan import Plan
from forge.cli.options import (
    RUN_FILE,
    SettingsCommand,
    click_value,
    envvars_of,
    field_value,
    settings_command,
    sources,
)
from forge.settings import Settings, SettingsError, build, entries, setting

AT_START = "(wired at start)"           # an address forge up learns once the service it names is ready
COMMANDS: dict[str, SettingsCommand] = {**{kind: s.command for kind, s in SERVICES.items()}, "up": up,
                                        "deploy": deploy}


def settings_commands() -> dict[str, SettingsCommand]:
    """Every command whose options are derived from settings, by the name of its run-file table."""
    return dict(COMMANDS)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _row(entry: Any, value: Any, source: str, table: str) -> dict[str, Any]:
    shown = "***" if entry.spec.secret and value not in (None, ()) else value
    return {"name": entry.name, "value": shown, "source": source, "env": " or ".join(envvars_of(entry, table)),
            "flag": entry.flag, "help": entry.spec.help}


def _print_table(table: str, rows: list[dict[str, Any]]) -> None:
    click.echo(f"[{table}]")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        value = r["value"]
        line = f"# {r['name']} is unset" if value is None else f"{r['name']} = {_toml(value)}"
        click.echo(f"{line:<{width + 24}} # {r['source']} ({r['flag']}, {r['env']})")


def services_of_up(values: dict[str, Any], run_file: str | None) -> dict[str, list[dict[str, Any]]]:
    """The settings of every service forge up would start (its first instance of each), with their sources."""
    import os

    config = up.settings_from({k: v for k, v in values.items() if k in {e.name for e in entries(UpConfig)}})
    config = replace(config, run_dir=config.run_dir or Path("runs/up-<time>"),
                     services=services_from(run_file, os.environ))
    shown: dict[str, list[dict[str, Any]]] = {}
    for instance in Plan(config).check():
        kind = instance.service.kind
        if kind in shown:
            continue
        node_values = _values(instance.settings)
        keyed = {f"{name}_file" for name in instance.key_files}
        shown[kind] = [_row(entry, AT_START if entry.name in instance.pending else
                            click_value(entry, node_values.get(entry.path)),
                            instance.sources.get(entry.name, "wired" if entry.name in keyed else "default"),
                            instance.service.table)
                       for entry in entries(type(instance.settings))]
    return shown


def _values(settings: Any) -> dict[tuple[str, ...], Any]:
    found = {}
    for entry in entries(type(settings)):
        node = settings
        for part in entry.path:
            node = getattr(node, part)
        found[entry.path] = None if entry.key_file else node
    return found


@dataclass(frozen=True, kw_only=True)
class ShowConfig(Settings):
    command: str = setting("up", argument=True, choices=tuple(COMMANDS), help="The command whose settings to show.")
    as_json: bool = setting(False, flag="json", help="Print machine-readable JSON.")


@click.group("config", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def config_group() -> None:
    """Inspect the settings of Forge's services."""


@settings_command("show", ShowConfig, table="config.show")
def show(config: ShowConfig) -> None:
    """Print every setting of COMMAND (learner, actor, gateway, cache, pool, rollout, tinker, up, deploy) with its
    effective value and its source, reading the FORGE_<COMMAND>_* environment and the run file given with --config
    as the command itself would; for up, the settings of every service it starts too. Secrets show as ***."""
    run_file = click.get_current_context().meta.get(RUN_FILE)
    target = COMMANDS[config.command]
    values, where = sources(target, ["--config", run_file] if run_file else [])
    rows = [_row(e, values.get(e.name), where.get(e.name, "default"), target.settings_table)
            for e in entries(target.settings_class)]
    problem = None
    try:
        build(target.settings_class, {e.name: field_value(e, values.get(e.name)) for e in entries(target.settings_class)
                                      if e.name in values})
        services = services_of_up(values, run_file) if config.command == "up" else {}
    except (SettingsError, click.UsageError) as exc:
        problem, services = str(exc), {}
    if config.as_json:
        click.echo(json.dumps({"command": config.command, "table": target.settings_table, "settings": rows,
                               "services": services, "error": problem}, indent=2, default=str))
    else:
        _print_table(target.settings_table, rows)
        for kind, service_rows in services.items():
            click.echo()
            _print_table(SERVICES[kind].table, service_rows)
    if problem:
        click.echo(f"forge {config.command} would refuse these settings: {problem}", err=True)
        sys.exit(2)


config_group.add_command(show)
