"""What every Forge command shares: logging set-up, the ``--config`` run-file option, entry points that read ``FORGE_*`` environment variables, and ready files.

Where an option's value comes from, highest first: the command line, the environment (``FORGE_<COMMAND>_<OPTION>``,
e.g. ``FORGE_ACTOR_PORT``), the run file (a TOML table named after the command, e.g. ``[actor]``), the default.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from forge.cli.options import CONTEXT_SETTINGS, config_option

__all__ = ["CONTEXT_SETTINGS", "check_port_option", "config_option", "entry_point", "setup_logging",
           "start_metrics", "write_ready_file"]

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


# HTTP clients that log every request at INFO (huggingface_hub's among them): their warnings only, unless DEBUG.
CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)
    if level.upper() != "DEBUG":
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


class FetchFailed(click.ClickException):
    """A model or dataset that cannot be had, said in one line (``Error: ...``); exit status 2, a usage error's."""

    exit_code = 2


def entry_point(command: click.Command, name: str) -> Callable[[], Any]:
    """A console-script entry point for ``command`` that reads ``FORGE_<NAME>_*`` environment variables."""
    prefix = "FORGE_" + name.upper().replace("-", "_")

    def main() -> Any:
        return command.main(prog_name=f"forge-{name}", auto_envvar_prefix=prefix)

    return main


def write_ready_file(path: Path, **fields: object) -> None:
    """Announce a started service (its addresses, pid, …) as JSON, atomically: readers never see half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({**fields, "pid": os.getpid()}))
    os.replace(temporary, path)


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def reachable_address(address: str) -> str:
    """``address`` (HOST:PORT) as another host can dial it: a wildcard bind (0.0.0.0, ::) names this host by its
    fully qualified name instead, which the ready file's readers (a gateway on another host) can resolve."""
    host, _, port = address.rpartition(":")
    if host not in WILDCARD_HOSTS:
        return address
    import socket

    return f"{socket.getfqdn()}:{port}"


def remove_ready_file(path: Path) -> None:
    """Withdraw the announcement of a stopping service: delete its ready file unless another process (a restarted
    instance) has written it since."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):      # gone, or not ours to judge: leave it
        pass


def start_metrics(report: Callable[[], Any], host: str, port: int | None, api_keys: Sequence[str] = (), *,
                  on_failure: Callable[[], None]) -> Any:
    """A service's ``/metrics`` server (``forge.prometheus.serve_metrics``; None when ``port`` is None). Where the port
    was taken since the start-up check, ``on_failure()`` stops what was started and the command fails in one line."""
    from forge.prometheus import serve_metrics

    try:
        return serve_metrics(report, host, port, api_keys)
    except OSError as exc:
        on_failure()
        raise click.ClickException(str(exc)) from None


def start_service_metrics(server: Any, report: Callable[[], Any], config: Any,
                          close: Callable[[], None]) -> tuple[Any, Callable[[], None]]:
    """``start_metrics`` for a gRPC ``server`` whose other resource ``close`` releases (its store), with the host,
    port and keys of its ``config``: the metrics server (None when off) and the ``on_stop`` that closes both. Where
    metrics cannot start, the server stops and ``close`` runs before the command fails."""
    def stop_started() -> None:
        server.stop(0)
        close()

    metrics = start_metrics(report, config.host, config.metrics_port, config.api_keys, on_failure=stop_started)

    def stop() -> None:
        if metrics is not None:
            metrics.close()
        close()

    return metrics, stop


def check_port_option(host: str, port: int | None, option: str) -> None:
    """Refuse a port that cannot be bound now as a bad ``option`` (one line, exit status 2), before anything heavy
    loads; None (the listener is off) and 0 (any free port) always pass."""
    from forge.rpc.server import check_port_free

    if port is None:
        return
    try:
        check_port_free(host, port)
    except OSError as exc:
        raise click.BadParameter(f"{exc} (another service there? {option} 0 picks a free port)",
                                 param_hint=f"'{option}'") from None


def tokenizer_option(model: str, option: str = "--model") -> Any:
    """The tokenizer of the model ``option`` names (a reference as every --model takes): a reference that names no
    model is a bad ``option``, a tokenizer that cannot be read a one-line error."""
    from forge.checkpoints import ModelNotFound, load_tokenizer

    try:
        return load_tokenizer(model)
    except ModelNotFound as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot load the tokenizer of {model}: {exc}") from exc
