"""A discrete-event simulation of rollout generation and training under the Windowed FIFO, comparing W = 1 (strict
FIFO), W = 0.3 N (Forge's setting) and W = N (greedy) on the same long-tail workload in one run.

Rollouts are issued in queue order to a fixed number of generation slots; each takes a time drawn from a long-tail
(log-normal) distribution. The learner takes ``batch`` completed entries from the window [head, head + W − 1]
(window sizes from the learner's own ``WindowConfig``), trains for ``train_s`` seconds, and bumps its version.
Reported per setting (medians over seeds): learner idle time (waiting for a full batch), staleness (learner
version at training − version when the rollout started), and drift: how much faster the trained samples were than
the workload's average over the first half of training (1.00 = no bias toward fast, easy samples).

Usage: python bench/scheduler_sim.py [--tasks 4000] [--slots 64] [--batch 16] [--train-s 2.0] [--seeds 5]
"""

from __future__ import annotations

import heapq
import random
import statistics

import click

from forge.learner.window import WindowConfig


def simulate(config: WindowConfig, tasks: int, slots: int, batch: int, train_s: float, sigma: float,
             seed: int) -> dict[str, float]:
    """One run; taking an entry consumes it and moves the head past consumed entries, as in the learner."""
    rng = random.Random(seed)
    durations = [rng.lognormvariate(0.0, sigma) * 10.0 for _ in range(tasks)]
    done = [False] * tasks
    consumed = [False] * tasks
    started_version = [0] * tasks
    events: list[tuple[float, int]] = []           # (finish time, task)
    issued = head = version = 0
    now = 0.0
    taken: list[int] = []
    trained: list[int] = []
    staleness: list[int] = []

    def issue(at: float) -> None:
        nonlocal issued
        if issued < tasks:
            started_version[issued] = version
            heapq.heappush(events, (at + durations[issued], issued))
            issued += 1

    for _ in range(slots):
        issue(0.0)
    while head < tasks:
        window = config.size(issued - head)
        eligible = [t for t in range(head, min(head + window, issued)) if done[t] and not consumed[t]]
        if eligible and len(taken) < batch:
            consumed[eligible[0]] = True
            taken.append(eligible[0])
            while head < tasks and consumed[head]:
                head += 1
            continue
        if len(taken) >= batch or (taken and not events):
            staleness += [version - started_version[t] for t in taken]
            trained += taken
            taken = []
            now += train_s
            version += 1
            while events and events[0][0] <= now:  # rollouts keep finishing while the learner trains
                finish, task = heapq.heappop(events)
                done[task] = True
                issue(finish)
            continue
        if not events:
            break
        finish, task = heapq.heappop(events)       # the learner waits for the next rollout to finish
        now = max(now, finish)
        done[task] = True
        issue(finish)
    population = statistics.fmean(durations)
    first_half = trained[: len(trained) // 2]
    return {
        "idle_frac": 1.0 - version * train_s / now if now else 0.0,
        "staleness": statistics.fmean(staleness) if staleness else 0.0,
        "drift": population / statistics.fmean(durations[t] for t in first_half) if first_half else 1.0,
        "wall_s": now,
    }


@click.command()
@click.option("--tasks", default=4000, show_default=True)
@click.option("--slots", default=64, show_default=True, help="Rollouts generated at once.")
@click.option("--batch", default=16, show_default=True, help="Entries per training step.")
@click.option("--train-s", default=2.0, show_default=True, help="Seconds per training step.")
@click.option("--sigma", default=1.0, show_default=True, help="Log-normal sigma of rollout times (the long tail).")
@click.option("--seeds", default=5, show_default=True)
def main(tasks: int, slots: int, batch: int, train_s: float, sigma: float, seeds: int) -> None:
    settings = {"W = 1 (strict FIFO)": WindowConfig(mode="fifo", batch_groups=batch),
                "W = 0.3 N (Forge)": WindowConfig(window=0.3, batch_groups=batch),
                "W = N (greedy)": WindowConfig(mode="greedy", batch_groups=batch)}
    print(f"{tasks} tasks, {slots} generation slots, batch {batch}, {train_s} s per step, log-normal sigma {sigma}; "
          f"medians over {seeds} seeds")
    print("| window | learner idle | mean staleness (versions) | drift to fast samples | wall time (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, config in settings.items():
        runs = [simulate(config, tasks, slots, batch, train_s, sigma, seed) for seed in range(seeds)]
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"| {name} | {med['idle_frac']:.1%} | {med['staleness']:.2f} | {med['drift']:.2f}x | "
              f"{med['wall_s']:,.0f} |")


if __name__ == "__main__":
    main()
