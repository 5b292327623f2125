"""The ``forge`` command group: every command of Forge under one program (the services also have programs of their
own, forge-learner, forge-actor, forge-gateway and forge-cache, which import their service alone)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping

import click

from forge import __version__
from forge.cli.common import CONTEXT_SETTINGS

# The commands by name, in the order they were added; each is imported by _load the first time it is looked up, so a
# short command (forge sandbox exec inside an episode, forge rollout) pays for its own imports alone.
NAMES = ("up", "rollout", "learner", "actor", "gateway", "cache", "tinker", "top", "plot", "dash", "model", "pool",
         "config", "keys", "deploy", "sandbox")


def _load(name: str) -> click.Command:
    """The command ``name``, imported now."""
    match name:
        case "up":
            from forge.app.up.cli import up as command
        case "rollout":
            from forge.rollout.cli import rollout as command
        case "learner":
            from forge.learner.cli import learner as command
        case "actor":
            from forge.actors.cli import actor as command
        case "gateway":
            from forge.gateway.cli import gateway as command
        case "cache":
            from forge.cache.cli import cache as command
        case "tinker":
            from forge.learner.tinker.cli import tinker as command
        case "top":
            from forge.app.top.cli import top as command
        case "plot":
            from forge.app.top.cli import plot as command
        case "dash":
            from forge.app.dash.cli import dash as command
        case "model":
            from forge.app.model_commands import model_group as command
        case "pool":
            from forge.pool.cli import pool_group as command
        case "config":
            from forge.app.config_show import config_group as command
        case "keys":
            from forge.app.keys import keys_group as command
        case "deploy":
            from forge.app.deploy.cli import deploy as command
        case "sandbox":
            from forge.app.sandbox_cli import sandbox_group as command
        case _:
            raise KeyError(name)
    return command


class LazyCommands(MutableMapping):
    """A group's commands by name (click's ``Group.commands``), each loaded by ``load`` when first looked up:
    listing the names imports nothing, and iterating over the items imports every command."""

    def __init__(self, names: tuple[str, ...], load: Callable[[str], click.Command]) -> None:
        self._names = list(names)
        self._load = load
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            if name not in self._names:
                raise KeyError(name)
            self._loaded[name] = self._load(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


class LazyGroup(click.Group):
    """A click group whose commands are imported when one is run (or its help shown), not when the group is."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(NAMES, _load)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="forge")
def forge() -> None:
    """Forge: reinforcement learning of LLM agents at scale.

    Services run as separate processes: forge actor (generation), forge gateway (the agents' door, recording every
    call in the pool), forge learner (training), forge cache (the L3 KV cache). Options can also come from
    FORGE_<COMMAND>_<OPTION> environment variables and from a TOML run file given with --config, whose tables
    ([learner], [actor], [gateway], [cache], [pool], [up]) may describe a whole deployment; forge config show
    COMMAND prints the settings a command would run with and where each came from.
    """


def main() -> None:
    forge.main(prog_name="forge", auto_envvar_prefix="FORGE")


if __name__ == "__main__":
    main()
