"""``forge model fetch MODEL``: a Hugging Face model downloaded into the Hugging Face cache, and its directory
printed (one line on stdout, nothing else on success), for a batch script to run once per node before the services
start; and ``fetch_model``, the same fetch every entry point makes before it reads a model it was given
(``forge up``, the other ``forge model`` commands). The services themselves only read the cache
(``forge.checkpoints.hub`` says why)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from forge.checkpoints import HubError, ModelNotFound, fetch_snapshot, resolve_model
from forge.cli.common import FetchFailed
from forge.cli.options import settings_command
from forge.settings import Settings, setting


def fetch_model(reference: str, *, progress: bool = True) -> Path:
    """The directory of the model ``reference`` names, a Hugging Face model fetched into the cache first (only what
    is not there yet; the cached copy when HF_HUB_OFFLINE is set or the Hub cannot be reached). ``progress``: the
    download's progress bars on stderr. FetchFailed saying why when it cannot be had."""
    try:
        ref = resolve_model(reference)
        if ref.hub is not None:
            return fetch_snapshot(ref.hub, progress=progress)
        return ref.directory
    except (HubError, ModelNotFound) as exc:
        raise FetchFailed(str(exc)) from None


@dataclass(frozen=True, kw_only=True)
class FetchConfig(Settings):
    model: str = setting(argument=True, validate=resolve_model,
                         help="A Hugging Face model id, org/name or org/name@revision (a branch, tag or commit); a "
                              "built-in model or a checkpoint directory is printed as it is.")
    progress: bool = setting(False, help="Show the download's progress on stderr.")


@settings_command("fetch", FetchConfig, table="model.fetch")
def fetch_command(config: FetchConfig) -> None:
    """Download what Forge loads of MODEL (config, tokenizer, chat template, safetensors weights) into the Hugging
    Face cache (HF_HOME, HF_HUB_CACHE; HF_TOKEN for a gated or private model, HF_ENDPOINT for a mirror) and print its
    directory. Files already in the cache are not downloaded again; with HF_HUB_OFFLINE=1 the cached copy is found
    without the network. Exit status 0, or 2 with one line saying why."""
    click.echo(fetch_model(config.model, progress=config.progress))


__all__ = ["FetchConfig", "FetchFailed", "fetch_command", "fetch_model"]
