"""The API keys of one ``forge up`` run: a random key for each kind of key its services use (the gateway's, the
actors', the cache's), made afresh for every run in RUN_DIR/keys. The services are given the files; the run's own
clients (the rollout driver, the evaluation, the live summary) read the keys in memory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from forge.app.api_keys import KeyFiles, make_key_files
from forge.app.registry import SERVICES
from forge.app.up.config import SERVICE_KINDS, UpConfig
from forge.cli.options import envvars_of
from forge.settings import entries

# The kinds of key a forge up run makes: those of the services it runs (its pool is a directory, not a service).
KINDS: tuple[str, ...] = tuple(kind for kind in SERVICE_KINDS if kind in {k for s in SERVICES.values()
                                                                          for k in s.keys.values()})

# The secrets forge up wires into each service (secret option → kind of key): its own key, and the keys of the
# services it calls.
WIRED: dict[str, dict[str, str]] = {kind: {name: key for name, key in SERVICES[kind].keys.items() if key in KINDS}
                                    for kind in SERVICE_KINDS}


def generate(directory: Path) -> KeyFiles:
    """New keys for every kind, written over any a previous run left (its processes are gone)."""
    return make_key_files(directory, KINDS, "forge up's {kind} API key for this run")


def keys_set_by(config: UpConfig, environ: Mapping[str, str]) -> list[str]:
    """The wired keys that the run file (``[gateway] api_key``), the environment (``FORGE_GATEWAY_API_KEYS``) or
    --set give a service although forge up makes them: the service would be given both and refuse to start."""
    found = []
    for kind, names in WIRED.items():
        service = SERVICES[kind]
        sources = config.overrides(kind).sources
        for entry in entries(service.settings_class):
            if entry.name.removesuffix("_file") not in names or entry.name not in sources:
                continue
            if sources[entry.name] == "environment":
                found += [name for name in envvars_of(entry, service.table) if environ.get(name, "").strip()]
            else:
                found.append(f"[{kind}] {entry.name}" if sources[entry.name] == "file" else
                             f"--set {kind}.{entry.name}")
    return found
