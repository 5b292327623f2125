"""What ``forge up`` shows while it runs: the services' latest Stats, polled in a thread through ``forge top``'s
poller, and the live summary table (reward per domain, calls, versions, learner step, actor throughput)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from forge.app.top.discovery import Target
from forge.app.top.poller import Poller
from forge.app.up.config import UpConfig
from forge.app.up.plan import Lane, lanes_of
from forge.app.up.system import System

POLL_S = 2.0                    # between two rounds of Stats calls
LAST_POLL_TIMEOUT_S = 10.0      # the round after the rollouts ended, whose figures the summary keeps


@dataclass
class RunState:
    started: float = field(default_factory=time.time)
    eval_start: dict[str, float] = field(default_factory=dict)          # sampled: the policy RL trains
    eval_end: dict[str, float] = field(default_factory=dict)
    eval_greedy_start: dict[str, float] = field(default_factory=dict)
    eval_greedy_end: dict[str, float] = field(default_factory=dict)
    eval_failures: int = 0
    training_started: float = 0.0
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)    # service name → its latest Stats gauges


def poll_stats(system: System, gauges: dict[str, dict[str, float]], stop: threading.Event) -> None:
    """Keep ``gauges`` (service name → its latest Stats gauges) at every service's latest Stats until ``stop``, then
    poll once more: the figures as the rollouts ended, not as they were up to a poll before. A busy or restarting
    service keeps its last figures."""
    targets = [Target(name, system.address(name), system.kind(name), system.key(system.kind(name)))
               for name in system.instances]

    def poll_once(poller: Poller) -> None:
        for state in poller.poll():
            if state.status == "up" and state.report is not None:
                gauges[state.name] = dict(state.report.gauges)

    with Poller(lambda: targets, timeout_s=POLL_S) as poller:
        while not stop.wait(POLL_S):
            poll_once(poller)
    with Poller(lambda: targets, timeout_s=LAST_POLL_TIMEOUT_S) as poller:
        poll_once(poller)


def summary_table(config: UpConfig, live: RunState, driver: Any, lane: Lane | None = None) -> Table:
    """The live summary of one lane's run (the run's only one by default)."""
    lane = lane or lanes_of(config)[0]
    elapsed = time.time() - (live.training_started or live.started)
    named = f" — run {lane.name}" if lane.name else ""
    table = Table(title=f"forge up{named} — {elapsed / 60:.1f} of {config.minutes:.0f} min — {lane.directory}")
    table.add_column("domain")
    table.add_column("train reward (last 64)", justify="right")
    table.add_column("eval at start", justify="right")
    rewards = driver.stats.reward()
    for domain in driver.workload.domains:
        table.add_row(domain, f"{rewards.get(domain, float('nan')):.2f}",
                      f"{live.eval_start.get(domain, float('nan')):.2f}")
    learner = live.gauges.get(lane.instance("learner"), {})
    gateway = live.gauges.get(lane.instance("gateway"), {})
    actor = live.gauges.get("actor-0", {})
    served, version = ("published adapter version", learner.get("version", 0)) if lane.name else (
        "actor weight version", actor.get("weight_version", 0))
    failures = f" · failed {driver.stats.failed}: {driver.stats.failures[-1][:80]}" if driver.stats.failed else ""
    table.caption = (f"episodes {driver.stats.episodes} (black-box {driver.stats.blackbox}) · "
                     f"calls/s {gateway.get('calls_per_s', 0):.1f} · {served} "
                     f"{version:.0f} · learner step {learner.get('step', 0):.0f} "
                     f"(window head {learner.get('head', 0):.0f}, staleness {learner.get('staleness_mean', 0):.1f}) · "
                     f"actor {actor.get('tokens_per_s', 0):.0f} tok/s{failures}")
    return table
