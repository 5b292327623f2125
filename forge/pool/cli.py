"""``forge pool``: inspect a Data Pool directory (figures, queue entries, one session decoded to text) and serve a
pool over gRPC. The inspection commands open the pool read-only, so they are safe while the gateway writes."""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from google.protobuf import json_format

from forge.cli.common import (
    CONTEXT_SETTINGS,
    check_port_option,
    setup_logging,
    start_service_metrics,
    tokenizer_option,
    write_ready_file,
)
from forge.cli.options import settings_command
from forge.pool.browse import shared_prefix
from forge.pool.config import PoolServeConfig
from forge.pool.errors import PoolError
from forge.pool.fifo import STATUS_NAMES
from forge.pool.layout import COMPLETED
from forge.pool.sessions import SESSION_STATUS_NAMES
from forge.settings import Settings, SettingsError, setting


def _open_reader(path: Path) -> Any:
    from forge.pool.pool import PoolReader

    try:
        return PoolReader(path)
    except (OSError, PoolError) as exc:
        raise click.ClickException(f"cannot open the pool at {path}: {exc}") from exc


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="seconds") if t else "-"


@click.group("pool", context_settings=CONTEXT_SETTINGS)
def pool_group() -> None:
    """Inspect a Data Pool (an LMDB directory) and serve it over gRPC.

    The pool holds every LLM call and session recorded by the gateway, and the generation queue from which the
    learner takes completed entries through a window [head, head + W - 1].
    """


def _existing_directory(path: Path) -> None:
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")


PATH_HELP = "The pool's directory (LMDB)."


@dataclass(frozen=True, kw_only=True)
class StatsConfig(Settings):
    path: Path = setting(argument=True, path="dir", validate=_existing_directory, help=PATH_HELP)
    as_json: bool = setting(False, flag="json", help="Print machine-readable JSON.")


@settings_command("stats", StatsConfig, table="pool.stats")
def stats_command(config: StatsConfig) -> None:
    """Counts of the pool at PATH: queue head and tail, entries by status, sessions, calls, bytes on disk."""
    path = config.path
    with _open_reader(path) as reader:
        figures = reader.stats()
    if config.as_json:
        click.echo(json.dumps({k: (int(v) if float(v).is_integer() else v) for k, v in figures.items()}, indent=2,
                              sort_keys=True))
        return
    f = {k: int(v) if float(v).is_integer() else v for k, v in figures.items()}
    click.echo(f"{path}")
    click.echo(f"  queue      head {f['head']}  tail {f['tail']}  ({f['in_queue']} not yet consumed; head entry "
               f"{figures['head_age_s']:.1f} s old)")
    click.echo(f"  entries    {f['queued']} pending  {f['completed']} completed  {f['consumed']} consumed  "
               f"{f['failed']} failed")
    click.echo(f"  cursor     seq {f['seq']}  committed {f['committed_seq']}")
    click.echo(f"  sessions   {f['sessions']} opened  {f['sessions_open']} open  {f['sessions_stored']} stored")
    click.echo(f"  calls      {f['calls']} appended  {f['calls_stored']} stored")
    click.echo(f"  disk       {figures['bytes_on_disk'] / 2**20:.1f} MiB on disk  "
               f"{figures['bytes_used'] / 2**20:.1f} MiB used  map {figures['map_size'] / 2**20:.0f} MiB")


@dataclass(frozen=True, kw_only=True)
class EntriesConfig(Settings):
    path: Path = setting(argument=True, path="dir", validate=_existing_directory, help=PATH_HELP)
    window: int | None = setting(None, short="w", min=1, help="Show the window [head, head + W - 1] and mark the "
                                                            "entries a fetch with this window returns.")
    start: int | None = setting(None, min=0, help="First queue position to show [default: the head].")
    limit: int = setting(50, min=1, help="Most entries to show without --window.")
    as_json: bool = setting(False, flag="json", help="Print machine-readable JSON.")


@settings_command("entries", EntriesConfig, table="pool.entries")
def entries_command(config: EntriesConfig) -> None:
    """Queue entries of the pool at PATH from the head on: status, group, sessions closed and failed."""
    window, start, limit = config.window, config.start, config.limit
    with _open_reader(config.path) as reader:
        cursor = reader.cursor()
        first = cursor.head if start is None else start
        entries = reader.entries(first, window if window else limit)
        if window:
            entries = [e for e in entries if e.position < cursor.head + window]
    now = time.time()
    if config.as_json:
        rows = [{"position": e.position, "status": STATUS_NAMES[e.status], "group_id": e.group_id,
                 "group_size": e.size, "sessions": e.members, "closed": e.closed, "failed": e.failed,
                 "created_at": e.created_at, "in_window": window is not None and e.position < cursor.head + window,
                 "fetched": window is not None and e.status == COMPLETED and e.position < cursor.head + window}
                for e in entries]
        click.echo(json.dumps({"head": cursor.head, "tail": cursor.tail, "seq": cursor.seq, "entries": rows},
                              indent=2))
        return
    span = f"; window {window}: positions {cursor.head}-{cursor.head + window - 1}" if window else ""
    click.echo(f"head {cursor.head}  tail {cursor.tail}  seq {cursor.seq}{span}")
    if not entries:
        click.echo("(no entries)")
        return
    click.echo(f"{'position':>9}  {'status':9}  {'closed':>8}  {'failed':>6}  {'age':>8}  group")
    for e in entries:
        mark = "  <- fetch" if window and e.status == COMPLETED else ""
        click.echo(f"{e.position:>9}  {STATUS_NAMES[e.status]:9}  {e.closed:>3}/{e.size:<4}  {e.failed:>6}  "
                   f"{now - e.created_at:>7.1f}s  {e.group_id or '-'}{mark}")


@dataclass(frozen=True, kw_only=True)
class ShowConfig(Settings):
    path: Path = setting(argument=True, path="dir", validate=_existing_directory, help=PATH_HELP)
    session_id: str = setting(argument=True, help="The session to show.")
    model: str = setting("tiny", help="Tokenizer to decode with: a checkpoint directory with tokenizer.json, or "
                                      "'tiny' (built-in).")
    show_ids: bool = setting(False, flag="ids", help="Print token ids instead of decoded text.")
    full_prompt: bool = setting(False, help="Print every call's whole prompt (default: only what it adds to the "
                                            "previous call).")
    as_json: bool = setting(False, flag="json", help="Print the session and its calls as JSON (token ids).")


@settings_command("show", ShowConfig, table="pool.show")
def show_command(config: ShowConfig) -> None:
    """One session of the pool at PATH with its calls decoded to text, rewards and metrics."""
    with _open_reader(config.path) as reader:
        try:
            found = reader.get_session(config.session_id)
        except PoolError as exc:
            raise click.ClickException(str(exc)) from exc
    if config.as_json:
        click.echo(json_format.MessageToJson(found, preserving_proto_field_name=True))
        return
    tokenizer = None if config.show_ids else tokenizer_option(config.model)

    def text(ids: list[int]) -> str:
        return " ".join(map(str, ids)) if tokenizer is None else tokenizer.decode(ids)

    s = found.session
    click.echo(f"session {s.session_id}  {SESSION_STATUS_NAMES.get(s.status, '?')}"
               f"{'  (' + s.failure_reason + ')' if s.failure_reason else ''}")
    click.echo(f"  task {s.task_id or '-'}  domain {s.domain or '-'}  group {s.group_id or '-'} (size {s.group_size})"
               f"  queue position {s.queue_position}")
    click.echo(f"  started {_when(s.started_at)}  ended {_when(s.ended_at)}  calls {s.num_calls}")
    for title, values in (("outcome rewards", s.outcome_rewards), ("metrics", s.metrics), ("metadata", s.metadata)):
        if values:
            click.echo(f"  {title}: " + "  ".join(f"{k}={v}" for k, v in sorted(values.items())))
    previous: list[int] = []
    for call in found.calls:
        prompt, completion = list(call.prompt_ids), list(call.completion_ids)
        versions = sorted(set(call.weight_versions))
        mean = sum(call.logprobs) / len(call.logprobs) if call.logprobs else 0.0
        finish = common_finish_name(call.finish_reason)
        click.echo(f"\n--- call {call.index}  actor {call.actor or '-'}  finish {finish}  "
                   f"{len(prompt)} prompt + {len(completion)} completion tokens  weight versions "
                   f"{versions[0] if versions else '-'}..{versions[-1] if versions else '-'}  "
                   f"mean logprob {mean:.3f}  {call.timing.total_s:.3f} s")
        shared = 0 if config.full_prompt else shared_prefix(previous, prompt)
        label = f"[prompt, after {shared} tokens shared with the previous call]" if shared else "[prompt]"
        click.echo(label)
        click.echo(text(prompt[shared:]))
        click.echo("[completion]")
        click.echo(text(completion))
        if call.process_rewards:
            click.echo("process rewards: " + ", ".join(f"{r:g}" for r in call.process_rewards))
        previous = prompt + completion


def common_finish_name(value: int) -> str:
    from forge.v1 import common_pb2

    try:
        return common_pb2.FinishReason.Name(value).removeprefix("FINISH_REASON_").lower()
    except ValueError:
        return str(value)


@dataclass(frozen=True, kw_only=True)
class ExportConfig(Settings):
    path: Path = setting(argument=True, path="dir", validate=_existing_directory, help=PATH_HELP)
    format: str = setting("jsonl", choices=("jsonl", "parquet"), help="Output format, one row per call.")
    out: Path | None = setting(None, short="o", path="file",
                               help="File to write [default: standard output; parquet needs a file].")
    model: str | None = setting(None, help="Tokenizer to add the prompt and completion text with (a checkpoint "
                                           "directory, 'tiny' or a Hub id) [default: token ids only].")
    domain: str | None = setting(None, help="Only sessions of this domain.")
    status: str | None = setting(None, choices=("open", "completed", "failed"), help="Only sessions in this status.")
    min_reward: float | None = setting(None, help="Only sessions whose outcome reward (the sum) is at least this.")
    max_reward: float | None = setting(None, help="Only sessions whose outcome reward (the sum) is at most this.")
    min_version: int | None = setting(None, min=0, help="Only sessions with tokens of this weight version or later.")
    max_version: int | None = setting(None, min=0, help="Only sessions with tokens of this weight version or earlier.")
    progress: bool = setting(True, help="Show progress on standard error (when it is a terminal).")

    def check(self) -> None:
        if self.format == "parquet" and self.out is None:
            raise SettingsError("parquet needs a file: give --out", "--out")
        if self.out is not None and not self.out.parent.is_dir():
            raise SettingsError(f"{self.out.parent} is not a directory", "--out")
        for low, high, flag in ((self.min_reward, self.max_reward, "--min-reward"),
                                (self.min_version, self.max_version, "--min-version")):
            if low is not None and high is not None and low > high:
                raise SettingsError(f"the range is empty: {low} > {high}", flag)


@settings_command("export", ExportConfig, table="pool.export")
def export_command(config: ExportConfig) -> None:
    """Write the calls of the pool at PATH as data, one row per call: ids, log-probs, weight versions, rewards,
    session and group keys (and text with --model); JSON Lines or Parquet (pandas, datasets.load_dataset)."""
    from forge.pool.browse import SessionFilter, call_row, matching_sessions

    try:
        where = SessionFilter(domain=config.domain, status=config.status, min_reward=config.min_reward,
                              max_reward=config.max_reward, min_version=config.min_version,
                              max_version=config.max_version)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if config.format == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as exc:
            raise click.ClickException(f"--format parquet needs pyarrow (pip install pyarrow): {exc}") from exc
    decode = tokenizer_option(config.model).decode if config.model is not None else None
    with _open_reader(config.path) as reader:
        try:
            total = int(reader.stats()["sessions_stored"])
        except PoolError as exc:
            raise click.ClickException(f"cannot read the pool at {config.path}: {exc}") from exc
        hidden = not (config.progress and sys.stderr.isatty())
        with click.progressbar(length=total, label="sessions", file=sys.stderr, hidden=hidden) as bar:
            def rows() -> Iterator[dict[str, Any]]:
                for found in matching_sessions(reader, where):
                    bar.update(1)
                    for call in sorted(found.calls, key=lambda c: c.index):
                        yield call_row(found.session, call, decode)

            count = _write_rows(rows(), config.format, config.out, decode is not None)
    if config.out is not None:
        click.echo(f"wrote {count} calls to {config.out}", err=True)


def _write_rows(rows: Iterator[dict[str, Any]], kind: str, out: Path | None, with_text: bool) -> int:
    from forge.pool.export import write_jsonl, write_parquet

    if out is None:
        return write_jsonl(rows, sys.stdout)
    if kind == "parquet":
        return write_parquet(rows, out, with_text)
    partial = out.with_name(f".{out.name}.partial")
    try:
        with partial.open("w") as handle:
            count = write_jsonl(rows, handle)
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return count


@settings_command("serve", PoolServeConfig, table="pool")
def serve_command(config: PoolServeConfig) -> None:
    """Serve the pool at --path as the forge.v1.Pool gRPC service (with health and reflection) until SIGTERM."""
    from forge.pool.pool import Pool
    from forge.pool.servicer import PoolServicer, serve_pool
    from forge.rpc import ServerOptions

    setup_logging(config.log_level)
    check_port_option(config.host, config.metrics_port, "--metrics-port")
    try:
        pool = Pool(config.path, config.storage)
    except (OSError, PoolError) as exc:
        raise click.ClickException(f"cannot open the pool at {config.path}: {exc}") from exc
    servicer = PoolServicer(pool)
    try:
        server = serve_pool(pool, ServerOptions(host=config.host, port=config.port, api_keys=config.api_keys),
                            servicer)
    except OSError as exc:
        pool.close()
        raise click.ClickException(str(exc)) from exc
    metrics, stop = start_service_metrics(server, servicer.report, config, pool.close)

    def ready() -> None:
        click.echo(f"serving the pool at {config.path} on {server.address}")
        if metrics is not None:
            click.echo(f"serving Prometheus metrics on {metrics.url}")
        sys.stdout.flush()
        if config.ready_file:
            write_ready_file(config.ready_file, address=server.address, kind="pool",
                             **({"metrics_url": metrics.url} if metrics is not None else {}))

    server.run_until_signal(on_stop=stop, on_ready=ready)


for _command in (stats_command, entries_command, show_command, export_command, serve_command):
    pool_group.add_command(_command)
