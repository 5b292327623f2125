"""``forge keys``: make the key files Forge's services authenticate with."""

from __future__ import annotations

from pathlib import Path

import click

from forge.cli.common import CONTEXT_SETTINGS, config_option


@click.group("keys", context_settings=CONTEXT_SETTINGS)
def keys_group() -> None:
    """Make key files for Forge's services."""


@keys_group.command("weights")
@config_option
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--actors", type=click.IntRange(min=1), default=1, show_default=True,
              help="Actor key pairs to make (actor-0, actor-1, ...).")
def weights(directory: Path, actors: int) -> None:
    """Make CURVE key pairs for the weight channel in DIRECTORY (ZeroMQ certificates): the learner's
    (learner.key_secret, and its public certificate learner.key for the actors), one per actor
    (actor-N.key_secret) and the actors' public certificates in clients/ (the learner's list of who may fetch).
    Key pair files are written with mode 0600; existing files are never overwritten. Then run
    forge learner --weights-key DIRECTORY/learner.key_secret --weights-clients DIRECTORY/clients and
    forge actor --weights-key DIRECTORY/actor-N.key_secret --weights-server-key DIRECTORY/learner.key."""
    from forge.weights.curve import create_keys

    try:
        made = create_keys(directory, [f"actor-{i}" for i in range(actors)])
    except FileExistsError as exc:
        raise click.BadParameter(str(exc), param_hint="DIRECTORY") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot write keys in {directory}: {exc.strerror or exc}",
                                 param_hint="DIRECTORY") from None
    click.echo(f"learner: --weights-key {made.server_secret} --weights-clients {made.clients_dir}")
    for name, secret in made.client_secrets.items():
        click.echo(f"{name}: --weights-key {secret} --weights-server-key {made.server_public}")
