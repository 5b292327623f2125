"""The run file as ``forge deploy`` reads it: every table the services will read is checked here, before anything is
written, against the settings of the command that reads it (an unknown key, a team without an agent, ...), so a
mistake stops the deploy in one line instead of crash-looping pods or a failed batch job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from forge.cli.options import field_value, read_run_file, table_of
from forge.settings import Entry, SettingsError, build, entries, flatten

# The run file's tables: the service that reads each, and the top-level tables forge rollout reads as its groups.
SERVICE_TABLES = ("learner", "actor", "gateway", "cache", "pool", "rollout")
SHARED_TABLES = ("model", "tasks", "agent")


class RunFileError(click.UsageError):
    """The run file cannot be deployed: one line saying why (exit status 2)."""


def commands() -> dict[str, Any]:
    """The click command of each service, by its run-file table."""
    from forge.app.config_show import settings_commands

    found = settings_commands()
    return {table: found[table] for table in SERVICE_TABLES}


@dataclass(frozen=True)
class RunFile:
    path: Path                              # absolute
    text: str
    tables: dict[str, Any]

    @classmethod
    def read(cls, path: str | Path) -> RunFile:
        """The run file at ``path``, every table the services read checked; RunFileError naming the file, the
        table and the key otherwise."""
        path = Path(path).resolve()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RunFileError(f"cannot read {path}: {exc}") from exc
        try:
            tables = read_run_file(path)
            for name in (*SERVICE_TABLES, *SHARED_TABLES):
                table_of(tables, name, path)
        except click.BadParameter as exc:
            raise RunFileError(exc.format_message()) from exc
        run = cls(path, text, tables)
        run._check()
        return run

    def table(self, name: str) -> dict[str, Any]:
        found = self.tables.get(name, {})
        return found if isinstance(found, dict) else {}

    def options(self, table: str) -> dict[str, Any]:
        """The service's table as flat option names (underscores) → values, as the service will read it."""
        command = commands()[table]
        try:
            return flatten(command.settings_class, self.table(table), f"{self.path} [{table}]")
        except SettingsError as exc:
            raise RunFileError(str(exc)) from exc

    @property
    def model(self) -> str | None:
        """``[model] path``, the policy every service serves or trains (None: the services' own tables or default)."""
        from forge.app.rollout.config import ModelChoice

        flat = self._group(ModelChoice, "model")
        return flat.get("model")

    @property
    def backend(self) -> str:
        return str(self.options("actor").get("backend", "torch"))

    @property
    def rollout(self) -> bool:
        """Whether the run file brings a team's tasks and agent, which a rollout driver plays."""
        return bool(self.table("tasks") or self.table("agent"))

    def _group(self, cls: type, table: str) -> dict[str, Any]:
        try:
            return flatten(cls, self.table(table), f"{self.path} [{table}]")
        except SettingsError as exc:
            raise RunFileError(str(exc)) from exc

    def _fields(self, cls: type, table: str) -> dict[str, Any]:
        """A table's values as ``cls``'s fields hold them (a TOML list as a tuple, a size in its field's units)."""
        by_name = {e.name: e for e in entries(cls)}
        return {name: _field(by_name[name], value) for name, value in self._group(cls, table).items()}

    def _check(self) -> None:
        from forge.app.rollout.config import AgentConfig, TasksConfig

        for table in SERVICE_TABLES:
            self.options(table)
        self.model  # noqa: B018  (checks the [model] table's keys)
        if self.rollout:
            try:
                tasks = build(TasksConfig, self._fields(TasksConfig, "tasks"))
                agent = build(AgentConfig, self._fields(AgentConfig, "agent"))
            except SettingsError as exc:
                raise RunFileError(f"{self.path}: [tasks]/[agent]: {exc}") from exc
            if not tasks.team or not agent.given:
                raise RunFileError(f"{self.path}: the rollout driver plays the team's tasks with its agent: give "
                                   "[tasks] (train or source, and verifier) and [agent] (command or python)")
        role = self.options("actor").get("role", "both")
        if role != "both":
            raise RunFileError(f"{self.path}: [actor] role = {role!r}: forge deploy runs every actor with role both "
                               "(prefill/decode actors are not deployed by it)")


def _field(entry: Entry, value: Any) -> Any:
    if entry.kind is tuple and isinstance(value, list):
        return tuple(str(v) for v in value)
    value = field_value(entry, value)
    return Path(value) if entry.kind is Path and isinstance(value, str) else value
