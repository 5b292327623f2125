"""API key files: one random key per kind of key (``forge.app.registry.KEY_KINDS``), each in DIRECTORY/KIND.key,
readable by its owner alone. Services are given the files (``--api-key-file``), never a key on a command line, where
every local user could read it. ``forge up`` makes them afresh for every run; ``forge keys api`` makes them for a
deployment of your own."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyFiles:
    directory: Path
    keys: Mapping[str, str]                    # kind of key → the key

    def file(self, kind: str) -> Path:
        return self.directory / f"{kind}.key"

    def key(self, kind: str) -> str:
        return self.keys[kind]


def make_key_files(directory: Path, kinds: Iterable[str], purpose: str, replace: bool = True) -> KeyFiles:
    """A new random key of every kind in ``kinds``, written to DIRECTORY/KIND.key (mode 0600, in a 0700 directory)
    with a comment line saying ``purpose`` (``{kind}`` in it names the kind). ``replace``: over any file left there;
    otherwise FileExistsError, before anything is written."""
    kinds = tuple(kinds)
    if not replace:
        taken = [directory / f"{kind}.key" for kind in kinds if (directory / f"{kind}.key").exists()]
        if taken:
            raise FileExistsError(f"{taken[0]} exists: keys are never overwritten (remove it, or choose another "
                                  "directory)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    keys = {kind: secrets.token_urlsafe(32) for kind in kinds}
    for kind, key in keys.items():
        descriptor = os.open(directory / f"{kind}.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)            # a file left by an earlier run keeps its mode otherwise
        with os.fdopen(descriptor, "w") as file:
            file.write(f"# {purpose.format(kind=kind)}\n{key}\n")
    return KeyFiles(directory, keys)
