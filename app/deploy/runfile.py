"""The run file as ``forge deploy`` reads it: every table the services will read is checked here, before anything is
written, against the settings of the command that reads it (an unknown key, a team without an agent, ...), so a
mistake stops the deploy in one line instead of crash-looping pods or a failed batch job."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import click

from forge.app.registry import SERVICES
from forge.cli.options import read_run_file, table_of
from forge.cli.overrides import Overrides
from forge.settings import SettingsError, build

# The run file's tables: the service that reads each, and the top-level tables forge rollout reads as its groups.
SERVICE_TABLES = tuple(SERVICES)
SHARED_TABLES = ("model", "tasks", "agent", "env", "sandbox")


class RunFileError(click.UsageError):
    """The run file cannot be deployed: one line saying why (exit status 2)."""


def settings_class(table: str) -> type:
    """The settings class of the service that reads ``table``."""
    return SERVICES[table].settings_class


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
        """The service's table as its option names (underscores) → the values its fields will hold, each checked
        against its setting."""
        return self._fields(settings_class(table), table)

    @property
    def model(self) -> str | None:
        """``[model] path``, the policy every service serves or trains (None: the services' own tables or default)."""
        from forge.rollout.config import ModelChoice

        return self._fields(ModelChoice, "model").get("model")

    @property
    def teacher(self) -> str | None:
        """``[learner] teacher``: the model the learner distils from, served by actors of its own (None: none)."""
        return self.options("learner").get("teacher")

    @property
    def model_impl(self) -> str | None:
        """``[model] impl`` (None: not given)."""
        from forge.rollout.config import ModelChoice

        return self._fields(ModelChoice, "model").get("model_impl")

    @cached_property
    def hub_models(self) -> list[str]:
        """The models the services load that are named by Hugging Face id (each once): the deployment fetches them
        where the services run, which then read them from the cache."""
        from forge.checkpoints.reference import hub_id_of

        named = [self.model, *(self.options(kind).get("model") for kind in ("learner", "actor", "gateway")),
                 self.teacher]
        ids = (hub_id_of(m) for m in named if isinstance(m, str))
        return list(dict.fromkeys(str(hub) for hub in ids if hub is not None))

    @property
    def backend(self) -> str:
        """The actors' backend, ``auto`` settled for the run's model."""
        from forge.actors.kinds import kind_of, pick_backend

        actor = self.options("actor")
        model = self.model or str(actor.get("model", "tiny"))
        try:
            backend = pick_backend(str(actor.get("backend", "auto")), model)[0]
        except ValueError as exc:       # auto reads the model's config: a Hub model not in this machine's cache
            raise RunFileError(f"{self.path}: the actors' backend is auto, which reads {model}'s config: {exc}; or "
                               "set [actor] backend") from None
        if not kind_of(backend).samples_model:
            raise RunFileError(f"{self.path}: [actor] backend = \"{backend}\" samples no model (it measures the "
                               "middleware alone): a training run needs torch, vllm, trtllm or auto")
        return backend

    @property
    def cache_serves_actors(self) -> bool:
        """Whether the actors' backend keeps KV blocks in forge-cache (the cache runs beside it only then)."""
        from forge.actors.kinds import kind_of

        return kind_of(self.backend).uses_l3_cache

    @property
    def rollout(self) -> bool:
        """Whether the run file brings a team's tasks and agent, or an environment, which a rollout driver plays."""
        return bool(self.table("tasks") or self.table("agent") or self.table("env"))

    @cached_property
    def held_out(self) -> bool:
        """Whether the rollout side has held-out tasks (``[tasks] eval`` or ``eval_fraction``, or the environment's
        ``eval_fraction``), which rollout driver 0 plays through an eval gateway at the start and the end."""
        from forge.rollout.config import EnvConfig, TasksConfig

        if not self.rollout:
            return False
        tasks = build(TasksConfig, self._fields(TasksConfig, "tasks"))
        env = build(EnvConfig, self._fields(EnvConfig, "env"))
        return bool(tasks.eval or tasks.eval_fraction or tasks.eval_split or env.eval_fraction)

    def _fields(self, cls: type, table: str) -> dict[str, Any]:
        """A table's values as ``cls``'s fields hold them (a TOML list as a tuple, a size in its field's units)."""
        try:
            return dict(Overrides.of(cls, self.table(table), "file", f"{self.path} [{table}]").values)
        except SettingsError as exc:
            raise RunFileError(str(exc)) from exc

    def _check(self) -> None:
        from forge.rollout.config import AgentConfig, EnvConfig, TasksConfig, check_one_workload

        for table in SERVICE_TABLES:
            self.options(table)
        self.model  # noqa: B018  (checks the [model] table's keys)
        if self.rollout:
            try:
                tasks = build(TasksConfig, self._fields(TasksConfig, "tasks"))
                agent = build(AgentConfig, self._fields(AgentConfig, "agent"))
                env = build(EnvConfig, self._fields(EnvConfig, "env"))
                check_one_workload(tasks, agent, env)
            except SettingsError as exc:
                raise RunFileError(f"{self.path}: [tasks]/[agent]/[env]: {exc}") from exc
            if not env.given and (not tasks.team or not agent.given):
                raise RunFileError(f"{self.path}: the rollout driver plays the team's tasks with its agent: give "
                                   "[tasks] (train or source, and verifier) and [agent] (command, python or mcp), or [env]")
        role = self.options("actor").get("role", "both")
        if role != "both":
            raise RunFileError(f"{self.path}: [actor] role = {role!r}: forge deploy runs every actor with role both "
                               "(prefill/decode actors are not deployed by it)")
