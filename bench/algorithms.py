"""Each of the learner's policy losses on the built-in tasks, side by side: the same ``forge up`` run (the tiny
model, the reasoning, QA and agent tasks, one seed) trained for ``--steps`` learner steps once per ``--losses``
entry, the loss set through ``--set learner.loss=KIND``; nothing else differs, except that ``dr_grpo`` also gets
``--set learner.normalize=none`` (Dr. GRPO drops the std division of advantages, and the learner refuses it with
``forge up``'s ``normalize = "domain"``).

Per loss:

- held-out reward per domain at the start and the end (``eval_start`` / ``eval_end`` of the run's summary.json: the
  mean of ``--eval-samples`` episodes at the training temperature on ``--eval-size`` held-out tasks per domain);
- the training–inference mismatch the learner measures each step (RUN_DIR/learner/metrics.jsonl, per domain,
  ``learner/corrections.py``): ``mismatch_kl`` (mean k3 = w − 1 − log w, w = π_learner / π_actor per token),
  ``mismatch_abs_logp`` (mean |Δ log p| = |log w|) and ``mismatch_outside`` (share of tokens with w outside
  [0.5, 2]), each the mean over the run's steps; and ``mismatch_current_frac``, the share of tokens whose learner
  side is the current policy rather than their own sampling version (forge up trains off-policy: for those the
  figures include the policy's own drift since the tokens were sampled, so they grow with the size of each update);
- the ``loss`` of the last step (each loss's own objective, plus the MTP draft's term: not comparable across losses
  in value), and the run's wall time (start-up, both held-out readings and training) with its training time (first
  to last step) in parentheses.

Each run stops at exactly ``--steps``: ``forge up --steps N`` has its learner stop at step N and ends the run
with it, so the end reading reads the policy of step N. Repeats are interleaved (repeat 1 of every loss, then repeat 2,
...) so that the machine's load falls on every loss alike; the table gives medians over ``--repeats``. Every run's
directory (logs, summary.json, metrics.jsonl) is kept under ``--out``, with results.json.

At the defaults a run takes about 2 minutes on a loaded 2-core VM (25 steps: forge up's warm-up; 32 held-out tasks a domain, 4
episodes each). A benchmark on a tiny model: the differences are not claims about the algorithms at scale.

Usage: python bench/algorithms.py [--losses cispo,ppo,grpo,gspo,dapo,dr_grpo] [--steps 25] [--repeats 1]
       [--seed 0] [--eval-size 32] [--eval-samples 4] [--out DIR] [--minutes 20]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import click

from forge.learner.loss_config import LOSS_KINDS

log = logging.getLogger("bench.algorithms")

MISMATCH = ("mismatch_kl", "mismatch_abs_logp", "mismatch_outside")
TAIL_LINES = 40


def forge_command() -> Path:
    """The ``forge`` command of this Python's environment (else the one on PATH)."""
    beside = Path(sys.executable).parent / "forge"
    if beside.is_file():
        return beside
    found = shutil.which("forge")
    if found is None:
        raise click.ClickException("no `forge` command beside this Python nor on PATH: install Forge (make venv)")
    return Path(found)


def parse_losses(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    losses = [name.strip() for name in value.split(",") if name.strip()]
    if not losses:
        raise click.BadParameter("name at least one loss", ctx, param)
    unknown = [name for name in losses if name not in LOSS_KINDS]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}: the learner's losses are {', '.join(LOSS_KINDS)}",
                                 ctx, param)
    if len(set(losses)) != len(losses):
        raise click.BadParameter("a loss is named twice", ctx, param)
    return losses


def records(path: Path) -> list[dict[str, Any]]:
    """The learner's step records so far (a line still being written is left out)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "step" in record:
            out.append(record)
    return out


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return f"({path} was not written)"
    with path.open(errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines))


def failure(message: str, run_dir: Path, up_log: Path) -> click.ClickException:
    return click.ClickException(
        f"{message}\n--- last {TAIL_LINES} lines of {up_log} ---\n{tail(up_log)}"
        f"--- last {TAIL_LINES} lines of {run_dir / 'logs' / 'learner.log'} ---\n"
        f"{tail(run_dir / 'logs' / 'learner.log')}")


def up_args(loss: str, run_dir: Path, steps: int, seed: int, eval_size: int, eval_samples: int,
            minutes: float) -> list[str]:
    args = ["up", "--run-dir", str(run_dir), "--steps", str(steps), "--minutes", str(minutes),
            "--eval-size", str(eval_size), "--eval-samples", str(eval_samples), "--seed", str(seed),
            "--set", f"learner.loss={loss}"]
    if loss == "dr_grpo":
        args += ["--set", "learner.normalize=none"]
    return args


def run_one(forge: Path, loss: str, run_dir: Path, steps: int, seed: int, eval_size: int, eval_samples: int,
            minutes: float) -> dict[str, Any]:
    """One ``forge up`` run of ``loss`` for ``steps`` learner steps; its figures."""
    run_dir.mkdir(parents=True)
    up_log = run_dir / "forge-up.log"
    metrics_path = run_dir / "learner" / "metrics.jsonl"
    command = [str(forge), *up_args(loss, run_dir, steps, seed, eval_size, eval_samples, minutes)]
    env = {**os.environ, "COLUMNS": "120", "TERM": "dumb", "NO_COLOR": "1"}
    started = time.perf_counter()
    hard_limit = minutes * 60 + 600            # forge up's own --minutes bounds training; the readings come on top
    with up_log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while process.poll() is None:
                time.sleep(1.0)
                if time.perf_counter() - started > hard_limit:
                    process.terminate()
                    process.wait(120)
                    raise failure(f"{loss}: forge up still ran after {hard_limit:.0f} s; stopped", run_dir, up_log)
        except BaseException:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(120)
                except subprocess.TimeoutExpired:
                    process.kill()
            raise
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise failure(f"{loss}: forge up exited with {process.returncode}", run_dir, up_log)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise failure(f"{loss}: forge up wrote no {summary_path}", run_dir, up_log)
    summary = json.loads(summary_path.read_text())
    steps_done = [r for r in records(metrics_path) if r["step"] <= steps]
    if len(steps_done) < steps:
        raise failure(f"{loss}: the learner made {len(steps_done)} of {steps} steps (forge up's --minutes "
                      f"{minutes} too short on this machine?)", run_dir, up_log)
    if not summary.get("eval_start") or not summary.get("eval_end"):
        raise failure(f"{loss}: summary.json has no held-out reading at the start or the end", run_dir, up_log)
    domains = list(summary["domains"])
    mismatch = {}
    for name in MISMATCH:
        for domain in domains:
            values = [r[f"{name}/{domain}"] for r in steps_done if r.get(f"{name}/{domain}") is not None]
            mismatch[f"{name}/{domain}"] = statistics.fmean(values) if values else float("nan")
    current = [r["mismatch_current_frac"] for r in steps_done if r.get("mismatch_current_frac") is not None]
    last = max(steps_done, key=lambda r: r["step"])
    return {"loss": loss, "run_dir": str(run_dir), "domains": domains, "eval_start": summary["eval_start"],
            "eval_end": summary["eval_end"], **mismatch,
            "mismatch_current_frac": statistics.fmean(current) if current else float("nan"),
            "final_loss": last["loss"], "wall_s": wall,
            "train_s": last["time"] - min(r["time"] for r in steps_done), "episodes": summary.get("episodes", 0)}


def median(runs: list[dict[str, Any]], key: str, domain: str | None = None) -> float:
    values = [(run[key][domain] if domain is not None else run[key]) for run in runs]
    return statistics.median(values)


def table(results: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    """Header and one row per loss: medians over its repeats, per-domain cells as ``a / b / c``."""
    domains = next(iter(results.values()))[0]["domains"]
    names = " / ".join(domains)
    rows = [["loss", f"held-out reward, start → end ({names})", f"k3 KL ({names})", f"mean |Δ log p| ({names})",
             f"w outside [0.5, 2] ({names})", "current-version share", "final loss", "wall s (training)"]]
    for loss, runs in results.items():
        rows.append([
            loss,
            " / ".join(f"{median(runs, 'eval_start', d):.2f} → {median(runs, 'eval_end', d):.2f}" for d in domains),
            " / ".join(f"{median(runs, f'mismatch_kl/{d}'):.1e}" for d in domains),
            " / ".join(f"{median(runs, f'mismatch_abs_logp/{d}'):.3g}" for d in domains),
            " / ".join(f"{100 * median(runs, f'mismatch_outside/{d}'):.2f} %" for d in domains),
            f"{100 * median(runs, 'mismatch_current_frac'):.0f} %",
            f"{median(runs, 'final_loss'):+.4f}",
            f"{median(runs, 'wall_s'):.0f} ({median(runs, 'train_s'):.0f})"])
    return rows


@click.command()
@click.option("--losses", default=",".join(LOSS_KINDS), show_default=True, callback=parse_losses,
              help="Comma-separated learner losses (forge-learner --loss).")
@click.option("--steps", type=click.IntRange(min=1), default=25, show_default=True,
              help="Learner steps per run (forge up's warm-up is 25 steps).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per loss (interleaved); the table gives medians.")
@click.option("--seed", type=int, default=0, show_default=True, help="forge up --seed of every run.")
@click.option("--eval-size", type=click.IntRange(1, 64), default=32, show_default=True,
              help="Held-out tasks per domain (forge up --eval-size).")
@click.option("--eval-samples", type=click.IntRange(min=1), default=4, show_default=True,
              help="Sampled episodes per held-out task (forge up --eval-samples).")
@click.option("--minutes", type=click.FloatRange(min=0.1), default=20.0, show_default=True,
              help="Training time a run may take at most (forge up --minutes); a run that makes fewer steps fails.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the runs go, one directory each [default: runs/bench-algorithms-<time>].")
def main(losses: list[str], steps: int, repeats: int, seed: int, eval_size: int, eval_samples: int, minutes: float,
         out: Path | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = out or Path("runs") / time.strftime("bench-algorithms-%Y%m%d-%H%M%S")
    planned = [(repeat, loss, out / f"{loss}-{repeat}") for repeat in range(1, repeats + 1) for loss in losses]
    taken = [str(run_dir) for _, _, run_dir in planned if run_dir.exists()]
    if taken:
        raise click.BadParameter(f"{', '.join(taken)}: already there (forge up would resume a run there); "
                                 "give another --out", param_hint="--out")
    if (out / "results.json").exists():
        raise click.BadParameter(f"{out} already holds a benchmark's results.json: give another --out",
                                 param_hint="--out")
    forge = forge_command()
    out.mkdir(parents=True, exist_ok=True)
    log.info("%d runs of forge up (%s; %d steps, seed %d, %d held-out tasks x %d episodes a domain) in %s",
             len(planned), ", ".join(losses), steps, seed, eval_size, eval_samples, out)
    results: dict[str, list[dict[str, Any]]] = {loss: [] for loss in losses}
    for number, (repeat, loss, run_dir) in enumerate(planned, start=1):
        result = run_one(forge, loss, run_dir, steps, seed, eval_size, eval_samples, minutes)
        results[loss].append(result)
        readings = ", ".join(f"{d} {result['eval_start'][d]:.2f}→{result['eval_end'][d]:.2f}"
                             for d in result["domains"])
        log.info("run %d/%d: %s, repeat %d: %d steps in %.0f s (training %.0f s); held-out %s; k3 KL %.1e; "
                 "loss %+.4f", number, len(planned), loss, repeat, steps, result["wall_s"], result["train_s"], readings,
                 statistics.fmean(result[f"mismatch_kl/{d}"] for d in result["domains"]), result["final_loss"])
    rows = table(results)
    (out / "results.json").write_text(json.dumps({"settings": {
        "losses": losses, "steps": steps, "repeats": repeats, "seed": seed, "eval_size": eval_size,
        "eval_samples": eval_samples}, "runs": results, "table": rows}, indent=2))
    click.echo(f"\nforge up, tiny model, built-in tasks; {steps} learner steps a run, seed {seed}, {eval_size} "
               f"held-out tasks x {eval_samples} episodes a domain; medians of {repeats}; mismatch: mean over steps")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        click.echo("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                             for i, (cell, width) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            click.echo("  ".join("-" * width for width in widths))
    click.echo(f"\nruns and results.json in {out}")


if __name__ == "__main__":
    main()
