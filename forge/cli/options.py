"""Click commands derived from settings dataclasses (``forge.settings``): one option per setting, with the field's
default, help and bounds, its ``FORGE_<COMMAND>_<OPTION>`` environment variable, and ``--config FILE`` reading the
command's table of a TOML run file. The command's function receives the built, validated settings.

Where a value comes from, highest first: the command line, the environment, the run file, the default.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from forge.settings import Entry, SettingsError, build, entries, flatten

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
RUN_FILE = "forge.run_file"          # the click context's meta key holding the --config path
GIVEN_ARGS = "forge.given_args"      # the click context's meta key holding the words a settings command was given
SOURCE_NAMES = {ParameterSource.COMMANDLINE: "flag", ParameterSource.ENVIRONMENT: "environment",
                ParameterSource.DEFAULT_MAP: "file", ParameterSource.DEFAULT: "default"}


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


class ByteSize(click.ParamType):
    """A size in bytes: 65536, 64MiB, 1GiB, ... (a setting's ``click_type=\"bytes\"``)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            self.fail(f"{value!r} is not a size such as 65536, 64MiB or 1GiB", param, ctx)
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


class JsonObject(click.ParamType):
    """A table of values: a JSON object on the command line or in a variable, a table in a run file."""

    name = "json-object"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            found = json.loads(value)
        except (TypeError, ValueError) as exc:
            self.fail(f"{value!r} is not a JSON object such as '{{\"num_train\": 64}}': {exc}", param, ctx)
        if not isinstance(found, dict):
            self.fail(f"{value!r} is not a JSON object such as '{{\"num_train\": 64}}'", param, ctx)
        return found


CLICK_TYPES: dict[str, click.ParamType] = {"bytes": ByteSize()}


def read_run_file(path: str | Path) -> dict[str, Any]:
    """A run file's tables; raises click.BadParameter for a file that cannot be read or parsed."""
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--config") from exc


def table_of(data: dict[str, Any], table: str, path: str | Path) -> dict[str, Any]:
    """The command's table (dotted for nested names, e.g. ``pool.serve``); empty when the file has none."""
    section: Any = data
    for part in table.split("."):
        section = section.get(part, {}) if isinstance(section, dict) else None
    if not isinstance(section, dict):
        raise click.BadParameter(f"{path}: [{table}] must be a table", param_hint="--config")
    return section


def click_value(entry: Entry, value: Any) -> Any:
    """A field value as the option takes it (scaled, joined)."""
    if value is None:
        return None
    if entry.spec.scale != 1:
        return value // entry.spec.scale if isinstance(value, int) else value / entry.spec.scale
    if entry.kind is tuple and entry.spec.separator:
        return _join(entry.spec.separator, value)
    return value


def file_value(entry: Entry, value: Any) -> Any:
    """A run file's value as click's default map takes it."""
    if entry.kind is tuple:
        items = value if isinstance(value, list) else [value]
        if entry.spec.separator:
            return _join(entry.spec.separator, [str(v) for v in items])
        return [str(v) for v in items]
    return value


def _join(separator: str, items: Any) -> str:
    return shlex.join(items) if separator == "shell" else separator.join(items)


def field_value(entry: Entry, value: Any) -> Any:
    """An option's value as the field holds it."""
    if value is None:
        return None
    if entry.spec.scale != 1:
        return value * entry.spec.scale
    if entry.kind is tuple:
        if entry.spec.separator == "shell":
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise SettingsError(f"cannot split {value!r} as a command line: {exc}", entry.flag) from exc
        if entry.spec.separator:
            return tuple(v.strip() for v in value.split(entry.spec.separator) if v.strip())
        return tuple(value)
    return value


def _param_type(entry: Entry) -> Any:
    spec = entry.spec
    if spec.click_type is not None:
        return CLICK_TYPES[spec.click_type]
    if spec.choices is not None and entry.kind in (str, tuple):
        return click.Choice(spec.choices, case_sensitive=False)
    if entry.kind is dict:
        return JsonObject()
    if entry.kind is Path:
        return click.Path(path_type=Path, file_okay=spec.path != "dir", dir_okay=spec.path != "file")
    if entry.kind in (int, float) and (spec.min is not None or spec.max is not None):
        low = None if spec.min is None else spec.min / spec.scale        # bounds in the option's units
        high = None if spec.max is None else spec.max / spec.scale
        if entry.kind is int:
            return click.IntRange(min=None if low is None else math.ceil(low),
                                  max=None if high is None else math.floor(high), min_open=spec.min_open)
        return click.FloatRange(min=low, max=high, min_open=spec.min_open)
    return {int: int, float: float}.get(entry.kind, str)


def envvars_of(entry: Entry, table: str) -> list[str]:
    """The environment variables an option reads: ``FORGE_<TABLE>_<OPTION>``, then the field's own, if any."""
    derived = f"FORGE_{table.upper().replace('.', '_')}_{entry.name.upper()}"
    return [derived, *([entry.spec.env] if entry.spec.env and entry.spec.env != derived else [])]


def option_for(entry: Entry, table: str) -> click.Parameter:
    """The click parameter of a setting: an option, or a positional argument (``argument=True``)."""
    spec = entry.spec
    default = click_value(entry, entry.default)
    multiple = entry.kind is tuple and not spec.separator
    value_type = _param_type(entry) if not (entry.kind is tuple and spec.separator) else str
    if spec.argument:
        given = {} if entry.required else {"default": default}       # click takes a given None for a value
        metavar = spec.metavar or entry.name.upper()
        return click.Argument([entry.name], type=value_type, nargs=-1 if multiple else 1, required=entry.required,
                              envvar=envvars_of(entry, table), metavar=metavar if entry.required else f"[{metavar}]",
                              **given)
    help_text = spec.help + (f" [unit: {spec.unit}]" if spec.unit else "")
    if spec.secret:
        help_text += (f" A value on the command line is visible to every local user in the process list: prefer "
                      f"{entry.flag}-file PATH or {envvars_of(entry, table)[0]}.")
    common: dict[str, Any] = {"help": help_text, "envvar": envvars_of(entry, table), "metavar": spec.metavar,
                              "show_default": default not in (None, (), "", {}) and not spec.secret}
    if entry.required:                 # click says "Missing option" (a value from the file or variable counts)
        common["required"] = True
        del common["show_default"]
    short = [f"-{spec.short}"] if spec.short else []
    if entry.kind is bool:
        off = spec.negative or f"no-{entry.name.replace('_', '-')}"
        return click.Option([f"{entry.flag}/--{off}", *short, entry.name], default=default, **{
            k: v for k, v in common.items() if k != "required"})
    if spec.choices is not None and entry.kind is tuple and spec.separator:
        common["help"] += f" (each of {', '.join(spec.choices)})"
    if not entry.required:
        common["default"] = default
    return click.Option([entry.flag, *short, entry.name], type=value_type, multiple=multiple, **common)


def _table_name(ctx: click.Context) -> str:
    """A plain command's table: its path below the program (``forge model info`` reads ``[model.info]``)."""
    below = ctx.command_path.split()[1:]
    return ".".join(below) if below else (ctx.info_name or "").removeprefix("forge-")


def _load_run_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if not value:
        return value
    command = ctx.command
    table = getattr(command, "settings_table", None) or _table_name(ctx)
    data = read_run_file(value)
    section = table_of(data, table, value)
    for shared in getattr(command, "shared_tables", ()):      # e.g. [tasks] read as forge up's tasks group
        if shared in data:
            if shared in section:
                raise click.BadParameter(f"{value}: give [{shared}] or [{table}.{shared}], not both",
                                         param_hint="--config")
            section = {**section, shared: table_of(data, shared, value)}
    cls = getattr(command, "settings_class", None)
    if isinstance(command, SettingsCommand):
        section = command.own_table(ctx, section)
    if cls is None:
        defaults = {k.replace("-", "_"): v for k, v in section.items()}
    else:
        try:
            flat = flatten(cls, section, f"{value} [{table}]")
        except SettingsError as exc:
            raise click.BadParameter(str(exc), param_hint="--config") from exc
        by_name = {e.name: e for e in entries(cls)}
        defaults = {name: file_value(by_name[name], v) for name, v in flat.items()}
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[RUN_FILE] = value
    return value


def config_option(func: Callable) -> Callable:
    """``--config FILE``: option defaults from the command's table of a TOML run file."""
    return click.option(
        "--config", type=click.Path(exists=True, dir_okay=False), is_eager=True, expose_value=False,
        callback=_load_run_file,
        help="TOML run file: this command's settings come from its table (e.g. [actor] port = 50051), below flags "
             "and environment variables. One file may hold every service's table.",
    )(func)


class SettingsCommand(click.Command):
    """A command whose options are a settings class's fields (``settings_class``), read from the run file's
    ``settings_table``."""

    def __init__(self, name: str, settings_class: type, table: str, run: Callable[[Any], Any],
                 shared_tables: tuple[str, ...] = (), **kwargs: Any):
        self.settings_class = settings_class
        self.settings_table = table
        self.shared_tables = shared_tables
        params = [option_for(e, table) for e in entries(settings_class)]
        super().__init__(name, callback=self._invoke, params=params, **kwargs)
        config_option(self)
        self.params.insert(0, self.params.pop())
        self._run = run

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse ``args`` as click does, keeping them (``given_args``)."""
        ctx.meta[GIVEN_ARGS] = tuple(args)
        return super().parse_args(ctx, args)

    def own_table(self, ctx: click.Context, section: dict[str, Any]) -> dict[str, Any]:
        """The run file's table of this command as its settings read it (a subclass may take keys out first)."""
        return section

    def settings_from(self, values: dict[str, Any]) -> Any:
        """The built settings from click's parsed values; raises click.UsageError for one it refuses."""
        by_name = {e.name: e for e in entries(self.settings_class)}
        try:
            return build(self.settings_class, {n: field_value(by_name[n], v) for n, v in values.items()
                                               if n in by_name})
        except SettingsError as exc:
            if exc.flag:
                raise click.BadParameter(exc.reason, param_hint=self._hint(exc.flag)) from exc
            raise click.UsageError(str(exc)) from exc

    def _hint(self, flag: str) -> str:
        """How click names the parameter behind ``flag``: the option, or a positional argument's metavar."""
        entry = next((e for e in entries(self.settings_class) if e.flag == flag), None)
        if entry is not None and entry.spec.argument:
            return entry.spec.metavar or entry.name.upper()
        return f"'{flag}'"

    def _invoke(self, **values: Any) -> Any:
        self._refuse_empty_secrets(click.get_current_context())
        return self._run(self.settings_from(values))

    def _refuse_empty_secrets(self, ctx: click.Context) -> None:
        """A secret's variable (or its key file's) set to nothing (a template with an unset variable gives that)
        would read as no secret at all, which for a key means no authentication: refuse it, unless the command line
        gives one."""
        for entry in entries(self.settings_class):
            if not (entry.spec.secret or entry.key_file) or \
                    ctx.get_parameter_source(entry.name) is ParameterSource.COMMANDLINE:
                continue
            for name in envvars_of(entry, self.settings_table):
                if name in os.environ and not os.environ[name].strip():
                    raise click.UsageError(f"{name} is set but empty: give a real value or unset it (an empty "
                                           f"{entry.flag} would mean none at all)")


def given_args(ctx: click.Context) -> tuple[str, ...]:
    """The words the settings command of ``ctx`` was given, below its program and group: ``forge learner ARGS`` and
    ``forge-learner ARGS`` both give ARGS."""
    return ctx.meta[GIVEN_ARGS]


def settings_command(name: str, settings_class: type, *, table: str | None = None,
                     shared_tables: tuple[str, ...] = ()) -> Callable[[Callable], Any]:
    """Decorate ``run(settings)`` into a click command named ``name`` whose options derive from ``settings_class``;
    its docstring is the command's help. ``shared_tables`` are top-level tables of the run file that the command
    reads as its groups of the same names (``[tasks]`` for forge up's ``tasks``)."""

    def decorate(run: Callable[[Any], Any]) -> SettingsCommand:
        return SettingsCommand(name, settings_class, table or name, run, shared_tables=shared_tables,
                               help=run.__doc__, context_settings=CONTEXT_SETTINGS)

    return decorate


def sources(command: SettingsCommand, args: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(values, source of each) that ``command`` would run with, given ``args`` and the environment."""
    ctx = command.make_context(command.name, list(args))
    with ctx:
        values = dict(ctx.params)
        where = {name: SOURCE_NAMES.get(ctx.get_parameter_source(name), "default") for name in values}
    return values, where

