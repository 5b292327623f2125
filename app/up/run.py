"""``forge up``'s run: the services started (``forge.app.up.system``), held-out evaluation at the start, the rollout
driver in this process with a live summary until the minutes or steps are spent, held-out evaluation at the end,
the services stopped, and the run directory's summary.json and reward curves written; the experiment trackers
``[tracking]`` names follow all of it (``forge.app.up.tracking``)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from forge.app.up.config import UpConfig
from forge.app.up.live import RunState, poll_stats, summary_table
from forge.app.up.plan import Lane, lanes_of
from forge.app.up.run_settings import run_settings
from forge.app.up.system import System
from forge.app.up.tracking import LaneTracking, open_lanes
from forge.rollout.team import Team

log = logging.getLogger("forge.up")


def workload_for(config: UpConfig, team: Team | None):
    from forge.rollout.workload import BuiltinWorkload

    if team is not None:
        from forge.checkpoints import load_tokenizer

        return team.workload(config.driver.sampling,
                             config.seed, load_tokenizer(config.model.path))
    return BuiltinWorkload(config.domains, temperature=config.driver.temperature, max_tokens=config.driver.max_tokens,
                           blackbox_every=config.blackbox_every, seed=config.seed, page_lines=config.long_page_lines)


@dataclass
class LaneRun:
    """One lane's part of the run (``forge.app.up.plan.Lane``): its workload, its figures and its rollout driver."""

    lane: Lane
    workload: Any
    live: RunState
    driver: Any = None


class Lanes:
    """The lanes of one run over its services: per lane, its held-out readings and its rollout driver."""

    def __init__(self, config: UpConfig, system: System, team: Team | None, console: Console) -> None:
        self.config, self.system, self.team, self.console = config, system, team, console
        self.held_out = team.tasks.eval if team is not None else ()
        self.gauges: dict[str, dict[str, float]] = {}       # service name → its latest Stats gauges
        self.tracked: dict[str, LaneTracking] = {}           # lane name → its run in the trackers
        self.parts = [LaneRun(lane, workload_for(replace(config, seed=config.seed + lane.index), team),
                              RunState(gauges=self.gauges)) for lane in lanes_of(config)]

    async def evaluate(self, part: LaneRun) -> tuple[dict[str, float], dict[str, float]]:
        from forge.checkpoints import load_tokenizer

        config, system = self.config, self.system
        if self.team is None:
            return await evaluate_both(config, system.get("actor-0").info["address"],
                                       load_tokenizer(config.model.path), system.key("actor"), adapter=part.lane.name)
        if not self.held_out:
            return {}, {}
        from forge.rollout.evaluate import evaluate_sessions

        door = system.get(part.lane.instance("gateway-eval")).info
        scores, failed = await evaluate_sessions(door["grpc_address"], door["http_address"], part.workload,
                                                 self.held_out, config.eval_samples, api_key=system.key("gateway"))
        part.live.eval_failures += failed
        return scores, {}

    async def evaluate_all(self, when: str) -> None:
        """The held-out readings of every lane at the ``start`` or the ``end``."""
        for part in self.parts:
            with self.console.status(f"held-out evaluation at the {when} ({part.lane.title}) …"):
                scores = await self.evaluate(part)
            live = part.live
            if part.lane.name in self.tracked:
                self.tracked[part.lane.name].evaluation(*scores)
            if when == "end":
                live.eval_end, live.eval_greedy_end = scores
                continue
            live.eval_start, live.eval_greedy_start = scores
            self.console.print(f"eval at start{f' ({part.lane.title})' if part.lane.name else ''}: "
                               f"{_rounded(live.eval_start)}"
                               + (f", greedy {_rounded(live.eval_greedy_start)}" if live.eval_greedy_start else ""))

    def start_drivers(self) -> None:
        """A rollout driver per lane, through its gateway, holding back while its pool queues enough groups."""
        from forge.pool import PoolReader
        from forge.rollout.driver import DriverConfig, RolloutDriver

        config, system = self.config, self.system
        for part in self.parts:
            gateway = system.get(part.lane.instance("gateway")).info
            batch_groups = system.instances[part.lane.instance("learner")].settings.window.batch_groups
            pool = PoolReader(part.lane.directory / "pool")

            def queued_groups(pool: PoolReader = pool) -> int:
                cursor = pool.cursor()
                return cursor.tail - cursor.head

            part.driver = RolloutDriver(DriverConfig(
                gateway["grpc_address"], gateway.get("http_address", ""), api_key=system.key("gateway"),
                group_size=config.group_size, groups_in_flight=config.driver.groups_in_flight,
                max_queued_groups=config.driver.groups_in_flight + 2 * batch_groups), part.workload,
                queued_groups=queued_groups)

    def lane_done(self, part: LaneRun) -> bool:
        """Whether the lane's learner has made the run's --steps (read from its metrics once it has stopped)."""
        steps, name = self.config.steps, part.lane.instance("learner")
        gauges = self.gauges.get(name, {})
        if not steps or gauges.get("step", 0) >= steps:
            return bool(steps)
        return name in self.system.exited() and _learner_figures(part.lane, gauges).get("step", 0) >= steps

    def trained_enough(self) -> bool:
        return all(self.lane_done(part) for part in self.parts)

    def ended_early(self) -> list[str]:
        """The services that ended before the run (a learner that made its steps, while other runs' learners go
        on, is not one)."""
        done = {part.lane.instance("learner") for part in self.parts if self.lane_done(part)}
        return [name for name in self.system.exited() if name not in done]

    def track(self) -> None:
        """Hand the trackers what is new: the learners' steps and sample tables, the rollouts' figures."""
        for part in self.parts:
            tracked = self.tracked.get(part.lane.name)
            if tracked is not None:
                tracked.follow()
                tracked.rollouts(part.driver.stats, self.gauges, part.lane.instance("learner"),
                                 part.lane.instance("gateway"))

    def close_trackers(self) -> None:
        """The learners' last steps to the trackers, and their runs ended."""
        for tracked in self.tracked.values():
            tracked.follow()
            tracked.trackers.close()

    def view(self) -> Any:
        tables = [summary_table(self.config, part.live, part.driver, part.lane) for part in self.parts]
        return tables[0] if len(tables) == 1 else Group(*tables)


async def run(config: UpConfig, console: Console, team: Team | None = None
              ) -> dict[str, Any]:
    """The run's summary (with ``--run``: ``{"runs": {NAME: summary}}``), also written to RUN_DIR/summary.json."""
    if any((lane.directory / "learner").is_dir() for lane in lanes_of(config)):
        console.print(f"continuing the run in {config.run_dir}: the learner resumes from its latest checkpoint")
    config.run_dir.mkdir(parents=True, exist_ok=True)
    system = System(config, eval_gateway=bool(team is not None and team.tasks.eval))
    lanes = Lanes(config, system, team, console)
    stop_polling = threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        with console.status("starting learner, actors and gateway …"):
            system.start()
        console.print("actors: {} ({})".format(*system.backend))
        lanes.tracked = open_lanes(config, system.instances, [part.lane for part in lanes.parts])
        if team is not None and team.environment is not None:
            console.print(team.environment.describe())
        await lanes.evaluate_all("start")
        lanes.start_drivers()
        poller = threading.Thread(target=poll_stats, args=(system, lanes.gauges, stop_polling), daemon=True)
        poller.start()
        driving = [asyncio.create_task(part.driver.run(stop)) for part in lanes.parts]
        started = time.time()
        for part in lanes.parts:
            part.live.training_started = started
        deadline = started + config.minutes * 60
        ended: list[str] = []
        with Live(lanes.view(), console=console, refresh_per_second=1) as shown:
            while (not stop.is_set() and time.time() < deadline and not any(task.done() for task in driving)
                   and not lanes.trained_enough() and not (ended := lanes.ended_early())):
                await asyncio.sleep(1.0)
                lanes.track()
                shown.update(lanes.view())
        if ended:
            console.print(f"{', '.join(ended)} ended: the run ends (logs in {config.run_dir / 'logs'})")
        stop.set()
        await asyncio.gather(*driving)
        stop_polling.set()
        await asyncio.to_thread(poller.join)
        lanes.track()
        await lanes.evaluate_all("end")
        settings = run_settings(config, system.instances)
        results = {part.lane.name: lane_result(part, settings) for part in lanes.parts}
    finally:
        stop_polling.set()
        for part in lanes.parts:
            await part.workload.close()
        with console.status("stopping services …"):
            system.stop()
        lanes.close_trackers()
    for part in lanes.parts:                    # after the learners stopped: their metrics are complete
        plot = _plot(part.lane.directory)
        results[part.lane.name]["plot"] = str(plot) if plot else None
    result = results[""] if list(results) == [""] else {"runs": results}
    (config.run_dir / "summary.json").write_text(json.dumps(result, indent=2))
    return result


def lane_result(part: LaneRun, settings: dict[str, Any]) -> dict[str, Any]:
    """One lane's summary; ``settings``: the run's (``run_settings``), as plain JSON."""
    live, driver, lane = part.live, part.driver, part.lane
    return {"config": settings["up"], "services": settings["services"], "domains": list(part.workload.domains),
            "eval_start": live.eval_start, "eval_end": live.eval_end,
            "eval_greedy_start": live.eval_greedy_start, "eval_greedy_end": live.eval_greedy_end,
            "eval_failed_sessions": live.eval_failures, "episodes": driver.stats.episodes,
            "blackbox_episodes": driver.stats.blackbox, "failed_episodes": driver.stats.failed,
            "failures": list(driver.stats.failures), "train_reward": driver.stats.reward(),
            "learner": _learner_figures(lane, live.gauges.get(lane.instance("learner"), {})),
            "gateway": live.gauges.get(lane.instance("gateway"), {}), "minutes": (time.time() - live.started) / 60}


def _learner_figures(lane: Lane, gauges: dict[str, float]) -> dict[str, float]:
    """The learner's last Stats gauges, its step and version those of its last metrics record where that is later
    (a learner that stopped at its last step, --steps, between two polls of its Stats)."""
    metrics = lane.directory / "learner" / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    last = json.loads(lines[-1]) if lines and lines[-1].strip() else {}
    if last.get("step", 0) <= gauges.get("step", 0):
        return gauges
    return {**gauges, "step": float(last["step"]), "version": float(last.get("version", gauges.get("version", 0)))}


async def evaluate_both(config: UpConfig, actor: str, tokenizer, api_key: str | None = None, adapter: str = ""
                        ) -> tuple[dict[str, float], dict[str, float]]:
    """The held-out reward sampled at the training temperature (``eval_samples`` per task), then greedy; with
    ``adapter``, of that run's adapter on the shared actor."""
    from forge.rollout.evaluate import evaluate_readings

    sampled, greedy = await evaluate_readings(actor, tokenizer, [(config.driver.temperature, config.eval_samples), (0.0, 1)],
                                              config.domains, config.eval_size, config.driver.max_tokens, api_key=api_key,
                                              adapter=adapter)
    return sampled, greedy


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {domain: round(value, 3) for domain, value in scores.items()}


def _plot(run_dir: Path) -> Path | None:
    """The run's reward, loss and throughput curves as run_dir/curves.png (None before the first step)."""
    from forge.app.top.plot import NoMetrics, draw, load_records, metrics_path, run_series

    try:
        records, _ = load_records(metrics_path(run_dir))
        return draw(run_series(records), run_dir / "curves.png", title=f"forge up: {run_dir.name}")
    except NoMetrics:
        log.warning("no learner metrics in %s: no curves drawn", run_dir)
        return None


def report(result: dict[str, Any], console: Console, run_name: str = "") -> None:
    """The held-out readings of ``result`` (``run``'s), a table per run."""
    if "runs" in result:
        for name, one in result["runs"].items():
            report(one, console, name)
        return
    greedy = bool(result["eval_greedy_start"])
    table = Table(title=(f"run {run_name}: " if run_name else "") + "held-out reward per domain"
                  + (" (sampled at the training temperature; greedy)" if greedy else ""))
    columns = ("domain", "start", "end", "change", *(("greedy start", "greedy end") if greedy else ()))
    for column in columns:
        table.add_column(column, justify="right" if column != "domain" else "left")
    for domain, start in result["eval_start"].items():
        end = result["eval_end"].get(domain, float("nan"))
        extra = (f"{result['eval_greedy_start'][domain]:.3f}", f"{result['eval_greedy_end'][domain]:.3f}") if greedy \
            else ()
        table.add_row(domain, f"{start:.3f}", f"{end:.3f}", f"{end - start:+.3f}", *extra)
    if not result["eval_start"]:
        console.print("no held-out tasks: give [tasks] eval or eval_fraction for a held-out reading")
    console.print(table)
    if result["failed_episodes"]:
        console.print(f"{result['failed_episodes']} of {result['episodes']} sessions failed; the latest: "
                      f"{result['failures'][-1]}")
