"""The CLIs' options: from flags, FORGE_* environment variables and a TOML config file, in that order of precedence,
and the address a service bound to every interface announces. (The programs themselves: integration/test_cli.py.)"""

from __future__ import annotations

import socket

import click
import pytest
from click.testing import CliRunner

from forge.cli.common import config_option, entry_point, reachable_address


@click.command("actor")
@config_option
@click.option("--port", default=1, show_default=True)
@click.option("--host", default="127.0.0.1")
def probe(port: int, host: str) -> None:
    click.echo(f"{host}:{port}")


def test_precedence_flag_over_env_over_config_over_default(tmp_path, monkeypatch):
    config = tmp_path / "forge.toml"
    config.write_text('[actor]\nport = 3\nhost = "10.0.0.1"\n')
    runner = CliRunner()
    run = lambda *args: runner.invoke(probe, list(args), auto_envvar_prefix="FORGE_ACTOR").output.strip()  # noqa: E731
    assert run() == "127.0.0.1:1"
    assert run("--config", str(config)) == "10.0.0.1:3"
    monkeypatch.setenv("FORGE_ACTOR_PORT", "4")
    assert run("--config", str(config)) == "10.0.0.1:4"
    assert run("--config", str(config), "--port", "5") == "10.0.0.1:5"


def test_bad_config_file_is_a_clear_error(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[actor\nport = ")
    result = CliRunner().invoke(probe, ["--config", str(config)])
    assert result.exit_code == 2 and "cannot read" in result.output


def test_entry_point_uses_the_command_prefix(monkeypatch, capsys):
    monkeypatch.setenv("FORGE_ACTOR_PORT", "7")
    monkeypatch.setattr("sys.argv", ["forge-actor"])
    with pytest.raises(SystemExit) as exit_info:
        entry_point(probe, "actor")()
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == "127.0.0.1:7"


def test_a_wildcard_bind_is_announced_by_the_hosts_name():
    """A service bound to every interface announces itself by this host's name, which other hosts can dial."""
    for address in ("0.0.0.0:5701", "[::]:5701", ":::5701"):
        assert reachable_address(address) == f"{socket.getfqdn()}:5701"
    for address in ("127.0.0.2:5701", "node-3.actor.forge.svc:50051", "[::1]:5701"):
        assert reachable_address(address) == address
