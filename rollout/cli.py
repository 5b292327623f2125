"""``forge rollout``: only the rollout side of a run — the team's tasks played by its agent and scored by its
verifier — against a gateway (and learner) that already run elsewhere. The command is its composition root."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

import click

from forge.cli.common import setup_logging
from forge.cli.options import RUN_FILE, settings_command
from forge.rollout.config import RolloutConfig
from forge.rollout.team import Team

log = logging.getLogger("forge.rollout")


@settings_command("rollout", RolloutConfig, shared_tables=("model", "tasks", "agent", "env", "sandbox"))
def rollout(config: RolloutConfig) -> None:
    """Roll out the team's tasks ([tasks], [agent] of the run file) or an environment's ([env]) through the gateway
    at --gateway: G sessions per task, each played by the agent and closed with the verifier's rewards, recorded in the gateway's pool for
    the learner that reads it. Stops after --episodes sessions, --minutes, or on Ctrl-C."""
    setup_logging(config.log_level)
    run_file = click.get_current_context().meta.get(RUN_FILE)
    base_dir = Path(run_file).resolve().parent if run_file else Path.cwd()
    try:
        team = (Team.load_env(config.env, base_dir, config.seed) if config.env.given else
                Team.load(config.tasks, config.agent, base_dir, config.seed, config.sandbox))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if team.environment is not None:
        click.echo(team.environment.describe())
    stats = asyncio.run(_roll_out(config, team))
    click.echo(f"{stats.episodes} sessions ({stats.failed} failed); reward per domain "
               f"{ {d: round(r, 3) for d, r in stats.reward().items()} }")


async def _roll_out(config: RolloutConfig, team: Team):
    from forge.checkpoints import load_tokenizer
    from forge.rollout.driver import DriverConfig, RolloutDriver

    workload = team.workload(config.driver.sampling,
                             config.seed, load_tokenizer(config.model.path))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ended(_outcome) -> None:
        if driver.stats.episodes % 16 == 0:
            log.info("%d sessions (%d failed); reward per domain %s", driver.stats.episodes, driver.stats.failed,
                     {d: round(r, 3) for d, r in driver.stats.reward().items()})
        if config.episodes and driver.stats.episodes >= config.episodes:
            stop.set()

    driver = RolloutDriver(DriverConfig(config.gateway, config.http or "", api_key=config.api_key,
                                        group_size=config.group_size,
                                        groups_in_flight=config.driver.groups_in_flight), workload, on_outcome=ended)
    deadline = time.monotonic() + config.minutes * 60 if config.minutes else None
    driving = asyncio.create_task(driver.run(stop))
    try:
        while not driving.done() and not stop.is_set():
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(stop.wait(), timeout)
            except TimeoutError:
                stop.set()
        stop.set()
        await driving
    finally:
        await workload.close()
    return driver.stats
