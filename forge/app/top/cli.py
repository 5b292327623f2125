"""The ``forge top`` and ``forge plot`` commands (registered under the ``forge`` group; also ``python -m forge.app.top``)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import click

from forge.cli.common import CONTEXT_SETTINGS, config_option


def _address(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> list:
    from forge.app.top.discovery import parse_address

    try:
        return [parse_address(v) for v in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None, so that the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


@click.command("top", context_settings=CONTEXT_SETTINGS)
@config_option
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--address", "-a", "targets", multiple=True, callback=_address, metavar="[NAME:]KIND=HOST:PORT",
              help="A service to watch besides those of RUN_DIR (repeatable); KIND is actor, gateway, pool, "
                   "learner, cache or router; a bare HOST:PORT is asked for its kind.")
@click.option("--api-key", default=None, help="API key sent to every service (for services started with keys).")
@click.option("--interval", "-n", default=1.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between refreshes.")
@click.option("--timeout", default=1.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Deadline of each Stats call in seconds; a service slower than that is shown as down.")
@click.option("--once", is_flag=True, help="Poll once, print and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON snapshot of every service and exit "
                                                      "(implies --once).")
@click.option("--local/--no-local", default=True, show_default=True,
              help="Also show this machine's CPU, memory and GPUs (read directly through /proc and NVML).")
@click.option("--count", default=0, type=click.IntRange(0), help="Stop after this many refreshes (0: until Ctrl-C).")
@click.option("--history", default=120, show_default=True, type=click.IntRange(2),
              help="Polls kept per service for sparklines and rates.")
def top(run_dir: Path | None, targets: list, api_key: str | None, interval: float, timeout: float, once: bool,
        as_json: bool, local: bool, count: int, history: int) -> None:
    """Live telemetry of a running Forge system in the terminal: every service's Stats (actors, gateway, pool,
    learner, cache, router, and any other), GPU figures through NVML (or a "no GPU" mark with CPU and memory),
    and the services that are down, with why and since when.

    Services come from RUN_DIR (its services.json, written by `forge up`, and any ready file *.json holding an
    "address", also one folder down) and from --address; RUN_DIR is read again at every refresh.
    """
    from rich.console import Console
    from rich.live import Live

    from forge.app.top.discovery import discover
    from forge.app.top.poller import Poller
    from forge.app.top.snapshot import sample_local, snapshot
    from forge.app.top.view import render

    if run_dir is not None and not run_dir.is_dir():
        raise click.BadParameter(f"{run_dir} is not a directory", param_hint="RUN_DIR")
    if run_dir is None and not targets and not local:
        raise click.UsageError("nothing to show: give a RUN_DIR, --address, or leave --local on")
    source = str(run_dir) if run_dir else ", ".join(t.address for t in targets)
    with Poller(lambda: discover(run_dir, targets), api_key=api_key, timeout_s=timeout, history=history) as poller:
        if as_json:
            data = snapshot(poller.poll(), sample_local() if local else None)
            click.echo(json.dumps(finite(data), indent=2))
            return
        console = Console()
        if once:
            console.print(render(poller.poll(), sample_local() if local else None, source, width=console.width))
            return
        try:
            with Live(console=console, auto_refresh=False, transient=False) as live:
                frames = 0
                while True:
                    started = time.monotonic()
                    frame = render(poller.poll(), sample_local() if local else None, source, interval,
                                   width=console.width)
                    live.update(frame, refresh=True)
                    frames += 1
                    if count and frames >= count:
                        break
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
        except KeyboardInterrupt:
            pass


@click.command("plot", context_settings=CONTEXT_SETTINGS)
@config_option
@click.argument("run", type=click.Path(exists=True, path_type=Path), metavar="RUN_DIR|METRICS.jsonl")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG to write [default: RUN_DIR/metrics.png, or next to the given JSONL file].")
@click.option("--title", default=None, help="Title of the figure [default: the run's path].")
def plot(run: Path, out: Path | None, title: str | None) -> None:
    """Plot reward (overall and per domain), loss and throughput of a run to a PNG.

    Reads the learner's metrics: RUN_DIR/metrics.jsonl, RUN_DIR/learner/metrics.jsonl, or the JSONL file given.
    """
    from forge.app.top.plot import NoMetrics, draw, load_records, metrics_path, run_series

    try:
        path = metrics_path(run)
        records, skipped = load_records(path)
        if not records:
            raise NoMetrics(f"{path} holds no records" + (f" ({skipped} unreadable lines)" if skipped else ""))
        series = run_series(records)
    except NoMetrics as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot read {run}: {exc}") from exc
    if out is None:
        out = run / "metrics.png" if run.is_dir() else path.with_suffix(".png")
    try:
        draw(series, out, title or str(run))
    except ImportError as exc:
        raise click.ClickException(f"forge plot needs matplotlib (pip install matplotlib): {exc}") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc}") from exc
    note = f", {skipped} unreadable lines skipped" if skipped else ""
    click.echo(f"wrote {out}: {len(series.steps)} steps, domains: "
               f"{', '.join(series.reward_by_domain) or 'none'}{note}")
