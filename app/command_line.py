"""A service's command line from its settings, typed: every option's flag and the text of its value come from the
setting itself (``forge.settings``), so a command line built here always names options the service has, in the
units it reads them. ``forge up`` builds its children's command lines from their settings objects; ``forge deploy``
from the values it wires, some of them shell references expanded where the service starts (``Shell``).

Secrets never go on a command line, where every local user reads them in the process list: they are given as key
files (``--api-key-file PATH``) or, by ``forge up``, as the service's own environment variables.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from forge.app.registry import Service
from forge.cli.options import envvars_of
from forge.settings import Entry, SettingsError, check_value, entries


class Shell(str):
    """A value the shell expands where the service starts (``$KEYS/pool.key``, ``$rank``): rendered in double
    quotes, never single, and not checked against its setting here (the service checks it)."""

    __slots__ = ()


def quote(value: str) -> str:
    """``value`` as one shell word: a ``Shell`` reference in double quotes, anything else quoted literally."""
    if isinstance(value, Shell):
        return f'"{value}"'
    return shlex.quote(value)


def setting_of(service: Service, name: str) -> Entry:
    """The setting behind option ``name`` (underscores) of ``service``; ValueError when it has none."""
    for entry in entries(service.settings_class):
        if entry.name == name and not entry.key_file:
            return entry
    raise ValueError(f"{service.kind} has no option --{name.replace('_', '-')}")


def option_words(service: Service, values: Mapping[str, Any]) -> list[str]:
    """``--flag value`` words for ``values`` (option name → the field's value, or a ``Shell`` reference), each
    checked against its setting: a switch is ``--flag`` or its off form, a repeatable option comes once per item, a
    scaled option in its own units. A secret is refused: give it as a key file (``key_file_words``)."""
    words: list[str] = []
    for name, value in values.items():
        entry = setting_of(service, name)
        if entry.spec.secret:
            raise ValueError(f"--{name.replace('_', '-')} is a secret: give it as a key file, never on a command line")
        words += _words(entry, value)
    return words


def _words(entry: Entry, value: Any) -> list[str]:
    spec = entry.spec
    if isinstance(value, Shell):
        return [entry.flag, value]
    try:
        check_value(entry, value)
    except SettingsError as exc:
        raise ValueError(str(exc)) from None
    if value is None:
        return []
    if entry.kind is bool:
        return [entry.flag if value else "--" + (spec.negative or f"no-{entry.name.replace('_', '-')}")]
    if entry.kind is tuple:
        if spec.separator == "shell":
            return [entry.flag, shlex.join(value)]
        if spec.separator:
            return [entry.flag, spec.separator.join(value)]
        return [word for item in value for word in (entry.flag, item)]
    if spec.scale != 1:
        value = value // spec.scale if isinstance(value, int) and value % spec.scale == 0 else value / spec.scale
    return [entry.flag, str(value)]


def key_file_words(service: Service, files: Mapping[str, str | Path]) -> list[str]:
    """``--<secret>-file PATH`` words for key files by secret option name (``api_key`` → ``--api-key-file``)."""
    words: list[str] = []
    for name, path in files.items():
        entry = setting_of(service, name)
        if not entry.spec.secret:
            raise ValueError(f"--{name.replace('_', '-')} is not a secret: it has no key file")
        words += [f"{entry.flag}-file", path if isinstance(path, Shell) else str(path)]
    return words


def key_variables(service: Service, names: Iterable[str]) -> dict[str, str]:
    """The environment variable a service reads each of its secret options ``names`` from, by option name."""
    return {name: envvars_of(setting_of(service, name), service.table)[0] for name in names}


def changed(settings: Any) -> dict[str, Any]:
    """The settings of ``settings`` that differ from their defaults, by option name, secrets aside (its groups'
    included, in field order)."""
    return {entry.name: value for entry, value in _values(settings)
            if not entry.spec.secret and value != entry.default}


def secrets_of(settings: Any) -> dict[str, Any]:
    """The secret settings of ``settings`` that hold a value, by option name (its groups' included)."""
    return {entry.name: value for entry, value in _values(settings)
            if entry.spec.secret and value not in (None, ())}


def _values(settings: Any) -> list[tuple[Entry, Any]]:
    found = []
    for entry in entries(type(settings)):
        if entry.key_file:
            continue
        node = settings
        for part in entry.path:
            node = getattr(node, part)
        found.append((entry, node))
    return found
