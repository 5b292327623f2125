"""The ``forge up`` command: its settings from flags, ``FORGE_UP_*`` variables and the run file's ``[up]`` table;
the services' settings from the run file's ``[learner]``, ``[actor]``, ``[gateway]`` and ``[cache]`` tables, their
``FORGE_<SERVICE>_*`` variables and ``--set``; all of it checked, with the team's tasks, before anything starts. A
model named by its Hugging Face id is fetched here, once, before any service starts; the services read it from the
cache (``forge.checkpoints.hub``)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from forge.app.model_fetch import fetch_model
from forge.app.registry import SERVICES
from forge.app.up.config import RENAMED, SERVICE_KINDS, UpConfig
from forge.app.up.keys import keys_set_by
from forge.app.up.plan import Plan
from forge.app.up.run import report, run
from forge.cli.common import setup_logging
from forge.cli.options import CONTEXT_SETTINGS, RUN_FILE, SettingsCommand, read_run_file, table_of
from forge.cli.overrides import Overrides
from forge.rollout.team import Team
from forge.settings import SettingsError

log = logging.getLogger("forge.up")
RENAMED_IN_FILE = "forge.up.renamed"          # the click context's meta key: renamed keys of the run file's [up]


def services_from(run_file: str | None, environ: Mapping[str, str]) -> dict[str, Overrides]:
    """The services' settings that the run file's tables and the environment give, each service's variables above
    its table (as the service itself would read them)."""
    tables = read_run_file(run_file) if run_file else {}
    found = {}
    for kind in SERVICE_KINDS:
        service = SERVICES[kind]
        table = table_of(tables, service.table, run_file) if run_file else {}
        found[kind] = (Overrides.of(service.settings_class, table, "file", f"{run_file} [{service.table}]")
                       | Overrides.from_environment(service.settings_class, service.table, environ))
    return found


def _text(value: Any) -> str:
    """A renamed option's value as --set takes it."""
    return ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)


class UpCommand(SettingsCommand):
    """``forge up``, which also reads the services' settings, and takes its renamed options with a warning."""

    def __init__(self) -> None:
        super().__init__("up", UpConfig, "up", start,
                         shared_tables=("model", "tasks", "agent", "env", "sandbox", "tracking"), help=start.__doc__,
                         context_settings=CONTEXT_SETTINGS)
        for old in RENAMED:
            self.params.append(click.Option([f"--{old.replace('_', '-')}", old], hidden=True, default=None,
                                            envvar=f"FORGE_UP_{old.upper()}"))

    def own_table(self, ctx: click.Context, section: dict[str, Any]) -> dict[str, Any]:
        ctx.meta[RENAMED_IN_FILE] = {k.replace("-", "_"): v for k, v in section.items()
                                     if k.replace("-", "_") in RENAMED}
        return {k: v for k, v in section.items() if k.replace("-", "_") not in RENAMED}

    def _invoke(self, **values: Any) -> Any:
        ctx = click.get_current_context()
        given = {**ctx.meta.get(RENAMED_IN_FILE, {}),
                 **{name: value for name in RENAMED if (value := values.pop(name)) is not None}}
        for name in given:
            kind, option = RENAMED[name].split(".")
            message = (f"forge up --{name.replace('_', '-')} (or [up] {name}) is deprecated: give --set "
                       f"{RENAMED[name]}=VALUE, or [{kind}] {option} in the run file")
            click.echo(f"Warning: {message}", err=True)
        renamed = tuple(f"{RENAMED[name]}={_text(value)}" for name, value in given.items())
        values["set"] = (*renamed, *values["set"])        # --set itself wins
        self._refuse_empty_secrets(ctx)
        config = self.settings_from(values)
        try:
            config = replace(config, services=services_from(ctx.meta.get(RUN_FILE), os.environ))
        except SettingsError as exc:
            raise click.UsageError(str(exc)) from None
        return self._run(config)


def start(config: UpConfig) -> None:
    """Run the whole system locally: learner, actors and gateway as separate processes on loopback, agents rolling
    out tasks, training with CISPO; held-out evaluation at the start and the end. By default the built-in tiny
    model and tasks (reasoning, QA, agent) with white-box and black-box agents; with --tasks, --verifier and --agent
    (or a run file's [tasks] and [agent] tables) the team's own tasks, scored by its verifier and played by its
    agent program. The services' own settings come from the run file's [learner], [actor], [gateway] and [cache]
    tables, their FORGE_<SERVICE>_* variables and --set (forge config show up lists them). Ctrl-C stops early
    (cleanly)."""
    setup_logging(config.log_level)
    if config.run_dir is None:
        config = replace(config, run_dir=Path("runs") / time.strftime("up-%Y%m%d-%H%M%S"))
    own_keys = keys_set_by(config, os.environ) if config.keys else []
    if own_keys:
        raise click.UsageError(f"forge up generates the run's keys, but {', '.join(own_keys)} "
                               f"{'sets one' if len(own_keys) == 1 else 'set some'}: remove "
                               f"{'it' if len(own_keys) == 1 else 'them'}, or give --no-keys to run without keys")
    run_file = click.get_current_context().meta.get(RUN_FILE)
    team = None
    base_dir = Path(run_file).resolve().parent if run_file else Path.cwd()
    try:                                    # every task, the verifier and the agent are checked before anything
        if config.env.given:
            team = Team.load_env(config.env, base_dir, config.seed)
        elif config.tasks.team:
            team = Team.load(config.tasks, config.agent, base_dir, config.seed, config.sandbox)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    console = Console()
    for model in config.hub_models():       # once, here: the services only read the cache
        console.print(f"fetching {model} into the Hugging Face cache (what is not there yet) …", soft_wrap=True)
        console.print(f"model {model}: {fetch_model(model)}", soft_wrap=True, markup=False, highlight=False)
    try:
        Plan(config).check(eval_gateway=bool(team and team.tasks.eval))
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    result = asyncio.run(run(config, console, team))
    report(result, console)
    console.print(f"run directory: {config.run_dir} (summary.json, curves.png, learner/metrics.jsonl, logs/)")


up = UpCommand()
