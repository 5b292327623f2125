"""``forge keys``: make the key files Forge's services authenticate with — the API keys of a deployment (one per
kind of key the services use, ``forge.app.registry``) and the CURVE key pairs of the weight channel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from forge.app.api_keys import make_key_files
from forge.app.registry import KEY_KINDS, SERVICES
from forge.cli.common import CONTEXT_SETTINGS
from forge.cli.options import settings_command
from forge.settings import Settings, setting


@click.group("keys", context_settings=CONTEXT_SETTINGS)
def keys_group() -> None:
    """Make key files for Forge's services."""


@dataclass(frozen=True, kw_only=True)
class ApiKeysConfig(Settings):
    directory: Path = setting(argument=True, path="dir", help="Where the key files go (made if missing).")


@settings_command("api", ApiKeysConfig, table="keys.api")
def api(config: ApiKeysConfig) -> None:
    """Make the API keys of a deployment in DIRECTORY: a random key per kind of key (one file each, KIND.key, mode
    0600), and say which option of which service reads each file. Existing files are never overwritten."""
    try:
        made = make_key_files(config.directory, KEY_KINDS, "Forge's {kind} API key", replace=False)
    except FileExistsError as exc:
        raise click.BadParameter(str(exc), param_hint="DIRECTORY") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot write keys in {config.directory}: {exc.strerror or exc}",
                                 param_hint="DIRECTORY") from None
    for kind in KEY_KINDS:
        readers = [f"{' '.join(s.program)} --{name.replace('_', '-')}-file"
                   for s in SERVICES.values() for name, key in s.keys.items() if key == kind]
        click.echo(f"{made.file(kind)}: {'; '.join(readers)}")


@dataclass(frozen=True, kw_only=True)
class WeightKeysConfig(Settings):
    directory: Path = setting(argument=True, path="dir", help="Where the key files go (made if missing).")
    actors: int = setting(1, min=1, help="Actor key pairs to make (actor-0, actor-1, ...).")


@settings_command("weights", WeightKeysConfig, table="keys.weights")
def weights(config: WeightKeysConfig) -> None:
    """Make CURVE key pairs for the weight channel in DIRECTORY (ZeroMQ certificates): the learner's
    (learner.key_secret, and its public certificate learner.key for the actors), one per actor
    (actor-N.key_secret) and the actors' public certificates in clients/ (the learner's list of who may fetch).
    Key pair files are written with mode 0600; existing files are never overwritten. Then run
    forge learner --weights-key DIRECTORY/learner.key_secret --weights-clients DIRECTORY/clients and
    forge actor --weights-key DIRECTORY/actor-N.key_secret --weights-server-key DIRECTORY/learner.key."""
    from forge.weights.curve import create_keys

    try:
        made = create_keys(config.directory, [f"actor-{i}" for i in range(config.actors)])
    except FileExistsError as exc:
        raise click.BadParameter(str(exc), param_hint="DIRECTORY") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot write keys in {config.directory}: {exc.strerror or exc}",
                                 param_hint="DIRECTORY") from None
    click.echo(f"learner: --weights-key {made.server_secret} --weights-clients {made.clients_dir}")
    for name, secret in made.client_secrets.items():
        click.echo(f"{name}: --weights-key {secret} --weights-server-key {made.server_public}")


keys_group.add_command(api)
keys_group.add_command(weights)
