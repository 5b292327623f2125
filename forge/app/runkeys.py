"""The API keys of one ``forge up`` run: one random key per keyed service kind (gateway, actor, cache), generated
afresh for every run and written to RUN_DIR/keys/KIND.key, readable by the user alone. Services are given the files
(``--api-key-file``, never a key on a command line, where every local user could read it); the run's own clients
(the rollout driver, the evaluation, the live summary) read the keys in memory."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("gateway", "actor", "cache")

# The secrets forge up wires into each service: its own key, and the keys of the services it calls.
WIRED = {"gateway": ("api_key", "actor_api_key"), "actor": ("api_key", "l3_api_key"), "cache": ("api_key",)}


@dataclass(frozen=True)
class RunKeys:
    directory: Path
    keys: Mapping[str, str]                    # service kind → its key

    def file(self, kind: str) -> Path:
        return self.directory / f"{kind}.key"

    def key(self, kind: str) -> str:
        return self.keys[kind]


def generate(directory: Path) -> RunKeys:
    """New keys for every kind, written (mode 0600, in a 0700 directory) over any a previous run left."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    keys = {kind: secrets.token_urlsafe(32) for kind in KINDS}
    for kind, key in keys.items():
        path = directory / f"{kind}.key"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)            # a file left by an earlier run keeps its mode otherwise
        with os.fdopen(descriptor, "w") as file:
            file.write(f"# forge up's {kind} API key for this run\n{key}\n")
    return RunKeys(directory, keys)


def keys_set_by(tables: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """The keys that a run file (``[gateway] api_key``, …) or the environment (``FORGE_GATEWAY_API_KEYS``, …) set
    for a service although forge up generates them: the service would be given both and refuse to start."""
    from forge.actors.config import ActorConfig
    from forge.app.up import leaf_keys
    from forge.cache.config import CacheConfig
    from forge.cli.options import envvars_of
    from forge.gateway.config import GatewayConfig
    from forge.settings import entries

    classes = {"gateway": GatewayConfig, "actor": ActorConfig, "cache": CacheConfig}
    found = []
    for table, names in WIRED.items():
        section = tables.get(table, {})
        given = leaf_keys(section) if isinstance(section, dict) else set()
        for entry in entries(classes[table]):
            if entry.name.removesuffix("_file") not in names:
                continue
            keys = {entry.name, entry.field.name + ("_file" if entry.key_file else "")}
            found += [f"[{table}] {key}" for key in sorted(keys & given)]
            found += [name for name in envvars_of(entry, table) if environ.get(name)]
    return found
