"""``forge rollout``: only the rollout side of a run — the team's tasks played by its agent and scored by its
verifier — against a gateway (and learner) that already run elsewhere. The command is its composition root."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

import click

from forge.cli.common import FetchFailed, setup_logging
from forge.cli.options import RUN_FILE, settings_command
from forge.rollout.config import RolloutConfig
from forge.rollout.run_summary import RunSummary
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
    _have_model(config.model.path)
    if config.eval_gateway and not team.tasks.eval:
        raise click.UsageError("--eval-gateway plays the held-out tasks: the run has none ([tasks] eval or "
                               "eval_fraction)")
    summary = asyncio.run(_roll_out(config, team))
    click.echo(f"{summary.episodes} sessions ({summary.failed_episodes} failed); reward per domain "
               f"{_rounded(summary.train_reward)}")
    if summary.eval_start or summary.eval_end:
        click.echo(f"held-out reward at the start {_rounded(summary.eval_start)}, at the end "
                   f"{_rounded(summary.eval_end) or '(not read: stopped by a signal)'}")
    if config.summary is not None:
        click.echo(f"summary: {config.summary}")


def _have_model(reference: str) -> None:
    """A model named by Hugging Face id (its tokenizer is what the rollout side reads) in the cache, fetched when it
    is not there yet; FetchFailed, one line, when it cannot be had."""
    from forge.checkpoints import HubError, fetch_snapshot, hub_id_of
    from forge.checkpoints.hub import cached_snapshot

    hub = hub_id_of(reference)
    if hub is None:
        return
    try:
        cached_snapshot(hub)
    except HubError:
        try:
            fetch_snapshot(hub, progress=False)
        except HubError as exc:
            raise FetchFailed(str(exc)) from None


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {domain: round(score, 3) for domain, score in scores.items()}


async def _evaluate(config: RolloutConfig, team: Team, workload, when: str, summary: RunSummary) -> dict[str, float]:
    """The held-out reward per domain through the eval gateway (none without one); its failed sessions are
    counted in ``summary``."""
    if not config.eval_gateway:
        return {}
    from forge.rollout.evaluate import evaluate_sessions

    log.info("held-out evaluation at the %s: %d tasks x %d", when, len(team.tasks.eval), config.eval_samples)
    scores, failed = await evaluate_sessions(config.eval_gateway, config.eval_http or "", workload, team.tasks.eval,
                                             config.eval_samples, api_key=config.api_key)
    log.info("held-out reward at the %s: %s (%d failed sessions)", when, _rounded(scores), failed)
    summary.eval_failed_sessions += failed
    return scores


async def _unless(signalled: asyncio.Event, work) -> Any:
    """``work``'s result, or None once ``signalled`` is set first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(signalled.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


async def _roll_out(config: RolloutConfig, team: Team) -> RunSummary:
    """Play the run: the held-out reading at the start (unless the summary being continued has it), the training
    sessions until --episodes, --minutes or a signal, and the held-out reading at the end — skipped when a signal
    stopped the run, since the services stop too; a signal also cuts the start's reading short."""
    from forge.checkpoints import load_tokenizer
    from forge.rollout.driver import DriverConfig, RolloutDriver

    workload = team.workload(config.driver.sampling,
                             config.seed, load_tokenizer(config.model.path))
    summary = RunSummary.read(config.summary)
    summary.starts += 1
    stop, signalled = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (signalled.set(), stop.set()))

    def ended(_outcome) -> None:
        if driver.stats.episodes % 16 == 0:
            log.info("%d sessions (%d failed); reward per domain %s", driver.stats.episodes, driver.stats.failed,
                     _rounded(driver.stats.reward()))
        if config.episodes and summary.episodes + driver.stats.episodes >= config.episodes:
            stop.set()

    driver = RolloutDriver(DriverConfig(config.gateway, config.http or "", api_key=config.api_key,
                                        group_size=config.group_size,
                                        groups_in_flight=config.driver.groups_in_flight), workload, on_outcome=ended)
    started = time.monotonic()
    try:
        if summary.eval_start:
            log.info("continuing the run of %s (start %d): held-out reward at its start %s", config.summary,
                     summary.starts, _rounded(summary.eval_start))
        else:
            summary.eval_start = await _unless(signalled, _evaluate(config, team, workload, "start", summary)) or {}
            summary.write(config.summary)
        if config.episodes and summary.episodes >= config.episodes:
            stop.set()                          # a continued run that had played its sessions
        deadline = time.monotonic() + config.minutes * 60 if config.minutes else None
        driving = asyncio.create_task(driver.run(stop))
        while not driving.done() and not stop.is_set():
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(stop.wait(), timeout)
            except TimeoutError:
                stop.set()
        stop.set()
        await driving
        if signalled.is_set():
            log.info("stopped by a signal: no held-out evaluation at the end")
        else:
            summary.eval_end = await _unless(signalled, _evaluate(config, team, workload, "end", summary)) or {}
    finally:
        await workload.close()
    summary.add(driver.stats, (time.monotonic() - started) / 60)
    summary.write(config.summary)
    return summary
