"""The ``forge top`` and ``forge plot`` commands (registered under the ``forge`` group; also ``python -m forge.app.top``)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from forge.cli.options import settings_command
from forge.settings import Settings, setting


def _check_addresses(values: tuple[str, ...]) -> None:
    from forge.app.top.discovery import parse_address

    for value in values:
        parse_address(value)


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None, so that the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class TopConfig(Settings):
    run_dir: Path | None = setting(None, argument=True, path="dir", help="A run directory to watch.")
    addresses: tuple[str, ...] = setting((), flag="address", short="a", metavar="[NAME:]KIND=HOST:PORT",
                                         validate=_check_addresses,
                                         help="A service to watch besides those of RUN_DIR (repeatable); KIND is "
                                              "actor, gateway, pool, learner, cache or router; a bare HOST:PORT is "
                                              "asked for its kind.")
    api_key: str | None = setting(None, secret=True, help="API key sent to every service (for services started "
                                                          "with keys).")
    interval: float = setting(1.0, short="n", min=0.1, help="Seconds between refreshes.")
    timeout: float = setting(1.0, min=0.05, help="Deadline of each Stats call in seconds; a service slower than that "
                                                 "is shown as down.")
    once: bool = setting(False, negative="no-once", help="Poll once, print and exit.")
    as_json: bool = setting(False, flag="json", help="Print one JSON snapshot of every service and exit (implies "
                                                     "--once).")
    local: bool = setting(True, help="Also show this machine's CPU, memory and GPUs (read directly through /proc "
                                     "and NVML).")
    count: int = setting(0, min=0, help="Stop after this many refreshes (0: until Ctrl-C).")
    history: int = setting(120, min=2, help="Polls kept per service for sparklines and rates.")


@settings_command("top", TopConfig)
def top(config: TopConfig) -> None:
    """Live telemetry of a running Forge system in the terminal: every service's Stats (actors, gateway, pool,
    learner, cache, router, and any other), GPU figures through NVML (or a "no GPU" mark with CPU and memory),
    and the services that are down, with why and since when.

    Services come from RUN_DIR (its services.json, written by `forge up`, and any ready file *.json holding an
    "address", also one folder down) and from --address; RUN_DIR is read again at every refresh.
    """
    from rich.console import Console
    from rich.live import Live

    from forge.app.top.discovery import discover, parse_address
    from forge.app.top.poller import Poller
    from forge.app.top.snapshot import sample_local, snapshot
    from forge.app.top.view import render

    run_dir, local, interval = config.run_dir, config.local, config.interval
    targets = [parse_address(value) for value in config.addresses]
    if run_dir is not None and not run_dir.is_dir():
        raise click.BadParameter(f"{run_dir} is not a directory", param_hint="RUN_DIR")
    if run_dir is None and not targets and not local:
        raise click.UsageError("nothing to show: give a RUN_DIR, --address, or leave --local on")
    source = str(run_dir) if run_dir else ", ".join(t.address for t in targets)
    with Poller(lambda: discover(run_dir, targets), api_key=config.api_key, timeout_s=config.timeout,
                history=config.history) as poller:
        if config.as_json:
            data = snapshot(poller.poll(), sample_local() if local else None)
            click.echo(json.dumps(finite(data), indent=2))
            return
        console = Console()
        if config.once:
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
                    if config.count and frames >= config.count:
                        break
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
        except KeyboardInterrupt:
            pass


@dataclass(frozen=True, kw_only=True)
class PlotConfig(Settings):
    run: Path = setting(argument=True, metavar="RUN_DIR|METRICS.jsonl", help="A run directory or a metrics file.")
    out: Path | None = setting(None, short="o", path="file",
                               help="PNG to write [default: RUN_DIR/metrics.png, or next to the given JSONL file].")
    title: str | None = setting(None, help="Title of the figure [default: the run's path].")


@settings_command("plot", PlotConfig)
def plot(config: PlotConfig) -> None:
    """Plot reward (overall and per domain), loss and throughput of a run to a PNG.

    Reads the learner's metrics: RUN_DIR/metrics.jsonl, RUN_DIR/learner/metrics.jsonl, or the JSONL file given.
    """
    from forge.app.top.plot import NoMetrics, draw, load_records, metrics_path, run_series

    run, out, title = config.run, config.out, config.title
    if not run.exists():
        raise click.BadParameter(f"{run} does not exist", param_hint="RUN_DIR|METRICS.jsonl")
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
