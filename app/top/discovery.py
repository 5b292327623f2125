"""Which services to watch: a run directory's ``services.json`` and ready files, plus explicit addresses.

``services.json`` (written by ``forge up``) lists ``{name, kind, address}`` per service, either as a list or under
a ``"services"`` key, with the service's ``api_key`` or the ``api_key_file`` holding it when it requires one. Any
other ``*.json`` file in the run directory or one folder below it that holds an ``address`` (or a gateway's ``grpc_address``) is a ready file; its name (the file's path without ``.json``) stays
the same when the service restarts on another port, so the service keeps its history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.app.registry import STATS_SERVICES
from forge.rpc.client import check_address

KINDS = tuple(STATS_SERVICES)          # the services that answer a Stats RPC


@dataclass(frozen=True)
class Target:
    """A service to poll. ``kind`` is one of KINDS, or "" when it must be found out by asking."""

    name: str
    address: str
    kind: str = ""
    api_key: str | None = None


def valid_address(address: str) -> bool:
    """HOST:PORT as every Forge client takes it (``forge.rpc.client.check_address``)."""
    try:
        check_address(address)
    except ValueError:
        return False
    return address == address.strip()


def parse_address(text: str) -> Target:
    """``kind=host:port``, ``name:kind=host:port`` or a bare ``host:port`` (its kind is asked for)."""
    label, _, address = text.rpartition("=")
    name, _, kind = label.rpartition(":") if ":" in label else ("", "", label)
    if not valid_address(address):
        raise ValueError(f"{text!r}: expected [NAME:]KIND=HOST:PORT or HOST:PORT")
    if kind and kind not in KINDS:
        raise ValueError(f"{text!r}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    return Target(name=name or (f"{kind}@{address}" if kind else address), address=address, kind=kind)


def _kind_hint(name: str, data: dict[str, Any]) -> str:
    for key in ("kind", "service"):
        if data.get(key) in KINDS:
            return data[key]
    if "base_url" in data or "http_address" in data:
        return "gateway"
    if "weights_fetch" in data:
        return "learner"
    stem = Path(name).name.lower()
    instance = str(data.get("instance", "")).lower()
    return next((k for k in KINDS if stem.startswith(k) or instance.startswith(k)), "")


def _ready_file(path: Path, name: str) -> Target | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # e.g. a ready file being written right now
        return None
    if not isinstance(data, dict):
        return None
    address = data.get("address") or data.get("grpc_address")
    if not isinstance(address, str) or not valid_address(address):
        return None
    key = data.get("api_key") if isinstance(data.get("api_key"), str) else None
    return Target(name=name, address=address, kind=_kind_hint(name, data), api_key=key)


def _services_file(path: Path) -> list[Target]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    entries = data.get("services", []) if isinstance(data, dict) else data
    found = []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(entry, dict) or not valid_address(str(entry.get("address", ""))):
            continue
        kind = str(entry.get("kind", ""))
        name = str(entry.get("name") or f"{kind or 'service'}-{index}")
        found.append(Target(name=name, address=entry["address"], kind=kind if kind in KINDS else "",
                            api_key=_key_of(entry)))
    return found


def _key_of(entry: dict[str, Any]) -> str | None:
    """A services.json entry's API key: given, or read from its key file (none when that cannot be read)."""
    from forge.settings import SettingsError, read_key_file

    if isinstance(entry.get("api_key"), str):
        return entry["api_key"]
    if isinstance(entry.get("api_key_file"), str):
        try:
            return read_key_file(Path(entry["api_key_file"]), "api_key_file", several=True)[0]
        except SettingsError:
            return None
    return None


def discover(run_dir: Path | None, explicit: Sequence[Target] = ()) -> list[Target]:
    """Every target named by ``run_dir`` (services.json first, then ready files) and ``explicit``, one per name
    and one per address (the first wins)."""
    found: list[Target] = list(explicit)
    if run_dir is not None and run_dir.is_dir():
        listed = run_dir / "services.json"
        if listed.is_file():
            found += _services_file(listed)
        for path in sorted([*run_dir.glob("*.json"), *run_dir.glob("*/*.json")]):
            if path != listed and path.is_file():
                target = _ready_file(path, path.relative_to(run_dir).with_suffix("").as_posix())
                if target is not None:
                    found.append(target)
    names: set[str] = set()
    addresses: set[str] = set()
    unique = []
    for target in found:
        if target.name not in names and target.address not in addresses:
            names.add(target.name)
            addresses.add(target.address)
            unique.append(target)
    return unique
