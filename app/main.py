"""The ``forge`` command group: every command of Forge under one program (the services also have programs of their
own, forge-learner, forge-actor, forge-gateway and forge-cache, which import their service alone)."""

from __future__ import annotations

import click

from forge import __version__
from forge.actors.cli import actor
from forge.app.config_show import config_group
from forge.app.dash.cli import dash
from forge.app.deploy.cli import deploy
from forge.app.keys import keys_group
from forge.app.model_commands import model_group
from forge.app.sandbox_cli import sandbox_group
from forge.app.top.cli import plot, top
from forge.app.up.cli import up
from forge.cache.cli import cache
from forge.cli.common import CONTEXT_SETTINGS
from forge.gateway.cli import gateway
from forge.learner.cli import learner
from forge.learner.tinker.cli import tinker
from forge.pool.cli import pool_group
from forge.rollout.cli import rollout


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="forge")
def forge() -> None:
    """Forge: reinforcement learning of LLM agents at scale.

    Services run as separate processes: forge actor (generation), forge gateway (the agents' door, recording every
    call in the pool), forge learner (training), forge cache (the L3 KV cache). Options can also come from
    FORGE_<COMMAND>_<OPTION> environment variables and from a TOML run file given with --config, whose tables
    ([learner], [actor], [gateway], [cache], [pool], [up]) may describe a whole deployment; forge config show
    COMMAND prints the settings a command would run with and where each came from.
    """


for command in (up, rollout, learner, actor, gateway, cache, tinker, top, plot, dash, model_group, pool_group, config_group,
                keys_group, deploy, sandbox_group):
    forge.add_command(command)


def main() -> None:
    forge.main(prog_name="forge", auto_envvar_prefix="FORGE")


if __name__ == "__main__":
    main()
