"""A discrete-event simulation of rollout generation and training under the Windowed FIFO, comparing W = 1 (strict
FIFO), W = 0.3 N (Forge's setting) and W = N (greedy) on the same long-tail workload in one run.

Tasks are issued in queue order to ``slots`` generation slots, while fewer than ``max_in_flight`` entries are issued
and not yet consumed (the rollout driver's backpressure); each takes a time drawn from a log-normal long tail, and a
rollout still running after ``timeout`` seconds is abandoned and declared failed (as the gateway's session timeout
does), which lets the head move past it. The learner takes ``batch`` completed entries, each from the window
[head, head + W − 1] at the time it is taken (window sizes from the learner's own ``WindowConfig``), then trains for
``train_s`` seconds. Reported per setting, medians over seeds: learner idle time while tasks are still being issued,
staleness (learner version when trained − version when the rollout started), drift (how much faster than the
workload's average the samples trained in the first half were; 1.00 = no bias toward fast, easy samples), and wall
time.

Usage: python bench/scheduler_sim.py [--tasks 4000] [--slots 128] [--batch 16] [--train-s 2.0] [--seeds 5]
"""

from __future__ import annotations

import heapq
import math
import random
import statistics

import click

from forge.pool.window import WindowConfig


def simulate(config: WindowConfig, tasks: int, slots: int, batch: int, train_s: float, sigma: float,
             timeout: float, max_in_flight: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    durations = [rng.lognormvariate(0.0, sigma) * 10.0 for _ in range(tasks)]
    done = [False] * tasks
    failed = [False] * tasks
    consumed = [False] * tasks
    started_version = [0] * tasks
    events: list[tuple[float, int]] = []           # (finish or abandon time, task)
    issued = head = version = free_slots = 0
    now = train_steady = 0.0
    steady_end = math.inf
    taken: list[int] = []
    trained: list[int] = []
    staleness: list[int] = []

    def issue(at: float) -> None:
        nonlocal issued, free_slots, steady_end
        while free_slots and issued < tasks and issued - head < max_in_flight:
            started_version[issued] = version
            heapq.heappush(events, (at + min(durations[issued], timeout), issued))
            issued += 1
            free_slots -= 1
            if issued == tasks:
                steady_end = at

    def finish(task: int, at: float) -> None:
        nonlocal free_slots
        done[task] = True
        failed[task] = durations[task] > timeout
        free_slots += 1
        advance_head()
        issue(at)

    def advance_head() -> None:
        nonlocal head
        while head < tasks and (consumed[head] or failed[head]):
            head += 1

    free_slots = slots
    issue(0.0)
    while head < tasks:
        window = config.size(issued - head)
        eligible = next((t for t in range(head, min(head + window, issued))
                         if done[t] and not failed[t] and not consumed[t]), None)
        if eligible is not None and len(taken) < batch:
            consumed[eligible] = True
            taken.append(eligible)
            advance_head()
            issue(now)
            continue
        if len(taken) >= batch or (taken and not events):
            staleness += [version - started_version[t] for t in taken]
            trained += taken
            taken = []
            if now < steady_end:
                train_steady += min(train_s, steady_end - now)
            now += train_s
            version += 1
            while events and events[0][0] <= now:  # rollouts keep finishing while the learner trains
                at, task = heapq.heappop(events)
                finish(task, at)
            continue
        if not events:
            break
        at, task = heapq.heappop(events)           # the learner waits for the next rollout to end
        now = max(now, at)
        finish(task, at)
    population = statistics.fmean(d for d in durations if d <= timeout)
    first_half = trained[: len(trained) // 2]
    return {
        "idle": 1.0 - train_steady / min(now, steady_end) if now else 0.0,
        "staleness": statistics.fmean(staleness) if staleness else 0.0,
        "drift": population / statistics.fmean(durations[t] for t in first_half) if first_half else 1.0,
        "wall": now,
        "failed": sum(failed) / tasks,
    }


@click.command()
@click.option("--tasks", default=4000, show_default=True)
@click.option("--slots", default=128, show_default=True, help="Rollouts generated at once.")
@click.option("--max-in-flight", default=512, show_default=True, help="Issued, not yet consumed entries at most.")
@click.option("--batch", default=16, show_default=True, help="Entries per training step.")
@click.option("--train-s", default=2.0, show_default=True, help="Seconds per training step.")
@click.option("--sigma", default=1.0, show_default=True, help="Log-normal sigma of rollout times (the long tail).")
@click.option("--timeout", default=120.0, show_default=True, help="Rollouts running longer are declared failed.")
@click.option("--seeds", default=5, show_default=True)
def main(tasks: int, slots: int, max_in_flight: int, batch: int, train_s: float, sigma: float, timeout: float,
         seeds: int) -> None:
    settings = {"W = 1 (strict FIFO)": WindowConfig(mode="fifo", batch_groups=batch),
                "W = 0.3 N (Forge)": WindowConfig(window=0.3, batch_groups=batch),
                "W = N (greedy)": WindowConfig(mode="greedy", batch_groups=batch)}
    print(f"{tasks} tasks, {slots} slots, at most {max_in_flight} in flight, batch {batch}, {train_s} s per step, "
          f"log-normal sigma {sigma} (mean {10 * math.exp(sigma ** 2 / 2):.1f} s), timeout {timeout} s; "
          f"medians over {seeds} seeds")
    print("| window | learner idle | mean staleness (versions) | drift to fast samples | wall time (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, config in settings.items():
        runs = [simulate(config, tasks, slots, batch, train_s, sigma, timeout, max_in_flight, seed)
                for seed in range(seeds)]
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"| {name} | {med['idle']:.1%} | {med['staleness']:.2f} | {med['drift']:.2f}x | {med['wall']:,.0f} |")


if __name__ == "__main__":
    main()
