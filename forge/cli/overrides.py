"""Settings of a command given from outside its own command line, as overrides of its fields: a run file's table
(``[learner] lr = 2e-4``), its ``FORGE_LEARNER_*`` variables, ``forge up --set learner.lr=2e-4``, or the same
written in code (the main job's own tuning). Keys are the command's option names (underscores or dashes, a group's
sub-table too); values are what a run file or a command line would give: in the option's units (``kv_cache_mb =
96``), as TOML values or as text. Each value is checked against its setting when the overrides are made, and each
keeps where it came from, which ``forge config show`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from forge.cli.options import envvars_of, field_value, file_value, option_for
from forge.settings import Entry, SettingsError, build, check_value, entries, flatten


@dataclass(frozen=True)
class Overrides:
    """Checked values of some settings of ``settings_class`` (option name → the field's value) and the source of
    each; ``a | b`` is ``a`` with ``b``'s values on top."""

    settings_class: type
    values: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, settings_class: type, table: Mapping[str, Any], source: str, where: str = "") -> Overrides:
        """Overrides from a table as a run file writes it; SettingsError naming ``where`` and the option for a key
        that is no setting or a value its setting refuses."""
        flat = flatten(settings_class, table, where or source)
        by_name = {e.name: e for e in entries(settings_class)}
        try:
            values = {name: _checked(by_name[name], value) for name, value in flat.items()}
        except SettingsError as exc:
            raise SettingsError(f"{where}: {exc}" if where else str(exc)) from None
        return cls(settings_class, values, dict.fromkeys(values, source))

    @classmethod
    def from_environment(cls, settings_class: type, table: str, environ: Mapping[str, str]) -> Overrides:
        """The settings that ``FORGE_<TABLE>_<OPTION>`` variables (or a setting's own variable) give, as the
        command itself would read them; a variable set to nothing is left out."""
        found: dict[str, Any] = {}
        for entry in entries(settings_class):
            given = [environ[name] for name in envvars_of(entry, table) if environ.get(name, "").strip()]
            if given:
                several = entry.kind is tuple and not entry.spec.separator
                found[entry.name] = given[0].split() if several else given[0]
        return cls.of(settings_class, found, "environment")

    def __or__(self, other: Overrides) -> Overrides:
        if other.settings_class is not self.settings_class:
            raise TypeError(f"overrides of {other.settings_class.__name__} on {self.settings_class.__name__}")
        return Overrides(self.settings_class, {**self.values, **other.values}, {**self.sources, **other.sources})

    def __bool__(self) -> bool:
        return bool(self.values)

    def build(self, **more: Any) -> Any:
        """The settings with these values and ``more`` (option name → field value) on top, validated."""
        return build(self.settings_class, {**self.values, **more})


def _checked(entry: Entry, value: Any) -> Any:
    """A table's value as the field holds it, converted as the option converts its text, and checked."""
    parameter = option_for(entry, "overrides")
    context = click.Context(click.Command("overrides"))
    try:
        converted = parameter.type_cast_value(context, file_value(entry, value))
        result = field_value(entry, converted)
    except click.BadParameter as exc:
        raise SettingsError(exc.message, entry.flag) from None
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"cannot take {value!r}: {exc}", entry.flag) from None
    if not entry.key_file:
        check_value(entry, result)
    return result
