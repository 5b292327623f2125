"""The ``forge dash`` command: its settings, and serving the dash until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from forge.cli.common import setup_logging, tokenizer_option, write_ready_file
from forge.cli.options import settings_command
from forge.settings import Settings, SettingsError, log_level_setting, ready_file_setting, setting

if TYPE_CHECKING:
    from forge.tokenizer import Tokenizer

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8265


def _check_addresses(values: tuple[str, ...]) -> None:
    from forge.app.top.discovery import parse_address

    for value in values:
        parse_address(value)


@dataclass(frozen=True, kw_only=True)
class DashConfig(Settings):
    run_dir: Path | None = setting(None, argument=True, path="dir",
                                   help="The run directory: its pools, learner/metrics.jsonl, summary.json and "
                                        "services.")
    host: str = setting(LOOPBACK, help="Address to bind (loopback by default; any other needs --api-key).")
    port: int = setting(DEFAULT_PORT, min=0, max=65535, help="Port to bind (0: any free port).")
    api_keys: tuple[str, ...] = setting((), flag="api-key", secret=True,
                                        help="Accept only requests with this key (repeatable): a browser signs in "
                                             "once, programs send Authorization: Bearer KEY. Required off "
                                             "loopback.")
    pool: Path | None = setting(None, path="dir", help="A pool directory to browse [default: the run's pools].")
    model: str | None = setting("tiny", help="Tokenizer to show text with: a checkpoint directory, 'tiny' or a "
                                             "Hub id in the local cache; 'none' shows token ids.")
    addresses: tuple[str, ...] = setting((), flag="address", short="a", metavar="[NAME:]KIND=HOST:PORT",
                                         validate=_check_addresses,
                                         help="A service to watch besides those of RUN_DIR (repeatable), as for "
                                              "forge top.")
    service_api_key: str | None = setting(None, secret=True,
                                          help="API key sent to every service's Stats (for services started with "
                                               "keys that services.json does not name).")
    interval: float = setting(2.0, min=0.2, help="Seconds between the services' Stats polls.")
    ready_file: Path | None = ready_file_setting("url, host, port, pid")
    log_level: str = log_level_setting()

    def check(self) -> None:
        from forge.app.dash.security import is_loopback

        if any(not key.strip() for key in self.api_keys):
            raise SettingsError("an empty key is not a key", "--api-key")
        if not is_loopback(self.host) and not self.api_keys:
            raise SettingsError(f"binding {self.host} (not loopback) needs --api-key or --api-key-file", "--host")
        if self.run_dir is None and self.pool is None and not self.addresses:
            raise SettingsError("nothing to show: give a RUN_DIR, --pool or --address", "RUN_DIR")


def _tokenizer(model: str | None) -> Tokenizer | None:
    return None if model is None or model == "none" else tokenizer_option(model)


async def _serve(config: DashConfig) -> None:
    from aiohttp import web

    from forge.app.dash.health import Health
    from forge.app.dash.server import build, make_app
    from forge.app.top.discovery import parse_address

    targets = [parse_address(value) for value in config.addresses]
    health = (Health(config.run_dir, targets, config.service_api_key, config.interval)
              if config.run_dir is not None or targets else None)
    dash = build(config.run_dir, config.pool, health, _tokenizer(config.model))
    runner = web.AppRunner(make_app(dash, config.host, config.api_keys), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise click.ClickException(f"cannot bind {config.host}:{config.port}: {exc.strerror or exc}") from exc
    port = runner.addresses[0][1]
    shown = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{shown}:{port}/"
    if health is not None:
        health.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    click.echo(f"forge dash on {url}{' (sign in with the key)' if config.api_keys else ''}")
    sys.stdout.flush()
    if config.ready_file:
        write_ready_file(config.ready_file, url=url, host=config.host, port=port)
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await runner.cleanup()


@settings_command("dash", DashConfig)
def dash(config: DashConfig) -> None:
    """A local, read-only web app on a run: live curves (reward per domain, loss, tokens/s, staleness, tree
    compression), the services' health (as forge top), and a trajectory browser over the run's pools: sessions by
    domain, reward, weight version and status, each as a transcript with its tokens coloured by log-prob,
    advantage, weight version or a learner checkpoint's importance ratio, and its group's prefix tree as the learner packs it.

    Loopback by default; bound to any other address it needs a key. It only reads: the pools are opened read-only
    and the services are only asked for their Stats.
    """
    setup_logging(config.log_level)
    asyncio.run(_serve(config))
