"""The live view: one rich renderable per refresh, a table per kind of service, devices and hosts, and the
services that are down. Only the gauges a service reports get a column; unknown services show all their gauges."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from forge.app.top import fmt
from forge.app.top.poller import ServiceState
from forge.app.top.snapshot import LocalMachine
from forge.v1 import common_pb2

Gauges = dict[str, float]


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[ServiceState, Gauges], str | Text]
    shown: Callable[[Gauges], bool] = lambda gauges: True
    spark: str = ""                  # a gauge whose recent values follow the cell as a sparkline (wide screens)
    spark_per: str = ""              # one sparkline point per distinct value of this gauge (e.g. the step)


def gauge(name: str, header: str, form: Callable[[float], str] = fmt.number, spark: bool = False,
          per: str = "") -> Column:
    def cell(_state: ServiceState, gauges: Gauges) -> str:
        return form(gauges[name]) if name in gauges else "-"

    return Column(header, cell, lambda gauges: name in gauges, name if spark else "", per)


def pair(first: str, second: str, header: str, form: Callable[[float], str] = fmt.number) -> Column:
    """Two gauges in one cell, e.g. p50/p99."""
    def cell(_state: ServiceState, gauges: Gauges) -> str:
        return f"{form(gauges[first]) if first in gauges else '-'}/{form(gauges[second]) if second in gauges else '-'}"

    return Column(header, cell, lambda gauges: first in gauges or second in gauges)


def prefixed(prefix: str, header: str) -> Column:
    """Every gauge ``prefix<key>`` as ``key value``, e.g. the learner's reward per domain."""
    def cell(_state: ServiceState, gauges: Gauges) -> str:
        return "  ".join(f"{k.removeprefix(prefix)} {fmt.number(v)}" for k, v in sorted(gauges.items())
                         if k.startswith(prefix))

    return Column(header, cell, lambda gauges: any(k.startswith(prefix) for k in gauges))


def matching(words: Sequence[str], header: str) -> Column:
    """Every gauge whose name holds one of ``words`` (e.g. the learner's tree compression, when it reports one)."""
    def pick(gauges: Gauges) -> list[str]:
        return sorted(k for k in gauges if any(w in k for w in words))

    def cell(_state: ServiceState, gauges: Gauges) -> str:
        names = pick(gauges)
        if len(names) == 1:
            return fmt.number(gauges[names[0]])
        return "  ".join(f"{k} {fmt.number(gauges[k])}" for k in names)

    return Column(header, cell, lambda gauges: bool(pick(gauges)))


def rate(name: str, header: str) -> Column:
    """A cumulative gauge with its rate over the kept history."""
    def cell(state: ServiceState, gauges: Gauges) -> str:
        per_s = state.rate(name)
        return fmt.number(gauges.get(name)) + (f" ({fmt.number(per_s)}/s)" if per_s else "")

    return Column(header, cell, lambda gauges: name in gauges)


def actor_churn() -> Column:
    """A gateway's actors that joined and that left (drained or dropped) since it started, and those draining now:
    shown once a gateway watching an actors directory (``--actors-dir``) has seen one come or go."""
    names = ("actors_joined", "actors_drained", "actors_dropped", "actors_draining")

    def cell(_state: ServiceState, gauges: Gauges) -> str:
        left = gauges.get("actors_drained", 0.0) + gauges.get("actors_dropped", 0.0)
        text = f"+{fmt.number(gauges.get('actors_joined', 0.0))} -{fmt.number(left)}"
        draining = gauges.get("actors_draining", 0.0)
        return text + (f" ({fmt.number(draining)} draining)" if draining else "")

    return Column("actors +/-", cell, lambda gauges: any(gauges.get(n, 0.0) for n in names))


def device_brief(report: common_pb2.StatsReport) -> Text:
    """One line per GPU (util, memory, power), or the no-GPU mark with the host's CPU and memory."""
    if report.devices:
        lines = [f"GPU{d.index} {fmt.number(d.utilization_pct)}% "
                 f"{fmt.used_of(d.memory_used_bytes, d.memory_total_bytes)} {d.power_w:.0f}W"
                 for d in report.devices]
        return Text("\n".join(lines))
    host = report.host
    text = Text("no GPU", style="bold yellow")
    text.append(f" · CPU {host.cpu_pct:.0f}% · RSS {fmt.size(host.process_rss_bytes)}")
    return text


HOST = Column("GPU / host", lambda s, g: device_brief(s.report) if s.report else "-")

SECTIONS: dict[str, tuple[str, list[Column]]] = {
    "actor": ("Actors", [
        gauge("tokens_per_s", "tok/s", spark=True), gauge("running", "run"), gauge("waiting", "wait"),
        gauge("kv_used_frac", "KV", fmt.percent), gauge("prefix_hit_rate", "prefix hit", fmt.percent),
        gauge("spec_acceptance", "spec acc", fmt.percent), gauge("weight_version", "weights", lambda v: f"v{v:.0f}"),
        gauge("relay_version", "relays", lambda v: f"v{v:.0f}" if v >= 0 else "-"),
        rate("relay_bytes_served", "relayed bytes"), gauge("preemptions", "preempt"), HOST]),
    "gateway": ("Gateway", [
        gauge("sessions_open", "sessions"), gauge("calls_per_s", "calls/s", spark=True), gauge("calls", "calls"),
        pair("latency_ms_p50", "latency_ms_p99", "latency p50/p99 ms"), pair("ttft_ms_p50", "ttft_ms_p99",
                                                                             "ttft p50/p99 ms"),
        gauge("in_flight", "in flight"), pair("actors_healthy", "actors", "actors ok"), actor_churn(),
        gauge("errors", "errors"),
        gauge("client_errors", "4xx")]),
    "pool": ("Pool", [
        gauge("queued", "queued"), gauge("completed", "completed", spark=True), rate("consumed", "consumed"),
        gauge("failed", "failed"), pair("head", "tail", "head/tail"), gauge("head_age_s", "head age", fmt.duration),
        gauge("appends_per_s", "appends/s"), gauge("sessions_open", "open sessions"),
        gauge("bytes_on_disk", "disk", fmt.size)]),
    "learner": ("Learner", [
        gauge("step", "step"), gauge("version", "version"), gauge("loss", "loss", spark=True, per="step"),
        gauge("reward_mean", "reward", spark=True, per="step"), prefixed("reward/", "reward by domain"),
        gauge("tokens_per_s", "tok/s"), pair("staleness_mean", "staleness_max", "staleness mean/max"),
        gauge("window", "window"), gauge("head", "head"), gauge("grad_norm", "grad norm"),
        gauge("step_s", "step s"), matching(("tree", "compression"), "tree compression"), HOST]),
}
TITLES = {"cache": "Cache", "router": "Router"}


ROLE_TITLES = ["Actors", "Prefill actors", "Decode actors"]


def _role(state: ServiceState) -> str:
    """The title of an actor's pool, from its ``role`` label (``both``, ``prefill``, ``decode``)."""
    role = state.report.labels.get("role", "both") if state.report else "both"
    return {"prefill": "Prefill actors", "decode": "Decode actors"}.get(role, "Actors")


def _name(state: ServiceState, instance: bool = True) -> Text:
    """The service's name, and its instance name when that says more (not when it is just its address)."""
    text = Text(state.name, style="bold")
    instance_name = state.report.instance if state.report and instance else ""
    if instance_name and instance_name != state.name and instance_name != state.target.address:
        text.append(f" {instance_name}", style="dim")
    return text


Cell = str | Text


def _plain(*cells: Cell) -> list[Text]:
    """Cells as Text: figures and names are never read as rich markup (e.g. ``[::1]:50051``)."""
    return [c if isinstance(c, Text) else Text(str(c)) for c in cells]


def _cell_width(cell: Cell) -> int:
    return max((Text(line).cell_len for line in str(cell).splitlines()), default=0)


def _fitted(title: str, headers: list[str], rows: list[list[Cell]], width: int | None,
            left: int = 1, style: str = "bold cyan") -> Table:
    """A table of ``rows`` whose trailing columns (lowest priority) are left out until it fits ``width``."""
    keep = len(headers)
    if width is not None:
        widths = [max([len(h), *(_cell_width(r[i]) for r in rows)]) + 2 for i, h in enumerate(headers)]
        while keep > 2 and sum(widths[:keep]) + keep + 1 > width:      # + the edges and column gaps
            keep -= 1
    table = Table(title=title, title_justify="left", title_style=style, box=box.SIMPLE_HEAD)
    for index, header in enumerate(headers[:keep]):
        table.add_column(header, justify="left" if index < left else "right")
    for row in rows:
        table.add_row(*_plain(*row[:keep]))
    return table


def _table(title: str, states: list[ServiceState], columns: list[Column], width: int | None) -> Table:
    shown = [c for c in columns if any(c.shown(dict(s.report.gauges)) for s in states if s.report)]
    if width is not None and width < 120:
        shown = [c for c in shown if c is not HOST]       # narrow: the devices table has it
    wide = width is None or width >= 120
    rows = []
    for state in states:
        gauges = dict(state.report.gauges) if state.report else {}
        cells: list[Cell] = [_name(state, wide)]
        for column in shown:
            cell = column.cell(state, gauges)
            if column.spark and wide and column.spark in gauges:
                cell = f"{cell} {fmt.sparkline(state.series(column.spark, column.spark_per), 10)}"
            cells.append(cell)
        rows.append(cells)
    table = _fitted(title, ["service", *(c.header for c in shown)], rows, width)
    if HOST in shown:
        table.columns[-1].justify = "left"
    return table


def _generic(title: str, states: list[ServiceState]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold cyan", box=box.SIMPLE_HEAD)
    table.add_column("service", no_wrap=True)
    table.add_column("figures")
    for state in states:
        gauges = dict(state.report.gauges) if state.report else {}
        table.add_row(*_plain(_name(state), "  ".join(f"{k} {fmt.number(v)}" for k, v in sorted(gauges.items()))
                              or "-"))
    return table


def _devices(states: list[ServiceState], local: LocalMachine | None, width: int | None) -> Group:
    """A row per GPU of every service (and of this machine), or one "no GPU" row with the host's figures; the
    reasons for "no GPU" follow the table, once per distinct reason."""
    sources = [(s.name, s.report.devices, s.report.host, True) for s in states if s.report and s.status == "up"]
    if local is not None:
        sources.append((f"local {local.hostname}".strip(), local.devices, local.host, False))
    any_gpu = any(devices for _, devices, _, _ in sources)
    if any_gpu:
        headers = ["where", "device", "util", "memory", "power", "held here", "CPU", "host memory", "temp",
                   "SM/mem clock"]
    else:
        headers = ["where", "device", "RSS", "CPU", "host memory"]
    rows: list[list[Cell]] = []
    reasons: dict[str, list[str]] = {}
    for where, devices, host, own_process in sources:
        cpu = f"{host.cpu_pct:.0f}% of {host.cpu_count}"
        memory = fmt.used_of(host.memory_used_bytes, host.memory_total_bytes)
        rss = fmt.size(host.process_rss_bytes) if own_process else "-"
        name = Text(where, style="bold")
        if not devices:
            reasons.setdefault(host.gpu_unavailable_reason or "no device reported", []).append(where)
            mark = Text("no GPU", style="bold yellow")
            if any_gpu:
                rows.append([name, mark, "-", "-", "-", f"{rss} RSS" if own_process else "-", cpu, memory, "-", "-"])
            else:
                rows.append([name, mark, rss, cpu, memory])
            continue
        for d in devices:
            rows.append([name, f"GPU{d.index} {d.name}", f"{d.utilization_pct:.0f}%",
                         fmt.used_of(d.memory_used_bytes, d.memory_total_bytes),
                         f"{d.power_w:.0f}/{d.power_limit_w:.0f} W",
                         fmt.size(d.process_memory_bytes) if own_process else "-", cpu, memory,
                         f"{d.temperature_c:.0f}°C", f"{d.sm_clock_mhz:.0f}/{d.memory_clock_mhz:.0f} MHz"])
    table = _fitted("Devices and hosts", headers, rows, width, left=2)
    notes = [Text(f"no GPU: {reason} ({', '.join(names)})", style="yellow") for reason, names in reasons.items()]
    return Group(table, *notes)


def _gpu_processes(local: LocalMachine) -> Table:
    table = Table(title="GPU processes (local)", title_justify="left", title_style="bold cyan", box=box.SIMPLE_HEAD)
    for header in ("device", "pid", "command", "memory"):
        table.add_column(header, justify="right" if header in ("pid", "memory") else "left")
    for p in local.processes:
        table.add_row(*_plain(f"GPU{p.device}", p.pid, p.command or "?", fmt.size(p.memory_bytes)))
    return table


def _down(states: list[ServiceState], now: float) -> Table:
    table = Table(title="Down", title_justify="left", title_style="bold red", box=box.SIMPLE_HEAD)
    for header in ("service", "kind", "address", "down since", "reason"):
        table.add_column(header)
    for s in states:
        since = time.strftime("%H:%M:%S", time.localtime(s.since)) if s.since else "-"
        table.add_row(*_plain(Text(s.name, style="bold red"), s.kind or s.target.kind or "?", s.target.address,
                              f"{since} ({fmt.duration(now - s.since) if s.since else '-'} ago)",
                              Text(s.reason or "not polled yet", style="red")))
    return table


def render(states: list[ServiceState], local: LocalMachine | None = None, source: str = "",
           interval_s: float | None = None, now: float | None = None, width: int | None = None) -> RenderableType:
    """One frame of ``forge top`` for a terminal ``width`` columns wide (None: unknown). Below 120 columns the
    sparklines, instance names and the GPU / host columns are left out, then trailing columns that do not fit."""
    now = time.time() if now is None else now
    up = [s for s in states if s.status == "up" and s.report is not None]
    down = [s for s in states if s not in up]
    header = Text("forge top", style="bold")
    if source:
        header.append(f"  {source}")
    header.append(f"  {len(up)} up", style="green")
    header.append(f", {len(down)} down", style="red" if down else "dim")
    header.append(f"  {time.strftime('%H:%M:%S', time.localtime(now))}")
    if interval_s:
        header.append(f"  every {interval_s:g}s · Ctrl-C quits", style="dim")
    parts: list[RenderableType] = [header]
    if not states:
        parts.append(Text("no services found: give a run directory with services.json or ready files, or "
                          "--address KIND=HOST:PORT", style="yellow"))
    def section(state: ServiceState) -> str:
        return state.report.service if state.report and state.report.service else state.kind

    kinds = [*SECTIONS, *TITLES, *sorted({section(s) for s in up} - set(SECTIONS) - set(TITLES))]
    for kind in kinds:
        members = [s for s in up if section(s) == kind]
        if not members:
            continue
        if kind == "actor":             # disaggregated: the prefill and decode pools apart
            title, columns = SECTIONS[kind]
            roles = sorted({_role(s) for s in members}, key=ROLE_TITLES.index)
            for role in roles:
                pool = [s for s in members if _role(s) == role]
                extra = [gauge("l3_handovers", "handovers")] if role == "Prefill actors" else []
                parts.append(_table(role, pool, [*columns[:-1], *extra, columns[-1]], width))
        elif kind in SECTIONS:
            title, columns = SECTIONS[kind]
            parts.append(_table(title, members, columns, width))
        else:
            parts.append(_generic(TITLES.get(kind, kind or "Other"), members))
    if up or local is not None:
        parts.append(_devices(up, local, width))
    if local is not None and local.processes:
        parts.append(_gpu_processes(local))
    if down:
        parts.append(_down(down, now))
    return Group(*parts)
