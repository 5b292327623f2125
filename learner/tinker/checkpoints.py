"""Where the Tinker server's training state lives on disk, under its run directory: a registry of the models
clients created (each model's description, written once when it is created) and each model's saved checkpoints,
named by ``tinker://`` paths.

Layout, under ``run_dir``::

    models/MODEL_ID/model.json                      the model: owner digest, base model, LoRA spec
    models/MODEL_ID/weights/NAME/                   a training state: the adapter (a PEFT directory),
                                                    optimizer.pt and state.json (the step)
    models/MODEL_ID/sampler_weights/NAME/           sampler weights: the adapter alone

``tinker://MODEL_ID/weights/NAME`` names the first kind, ``tinker://MODEL_ID/sampler_weights/NAME`` the second.
Names and ids are checked against a strict pattern before any path is built from them (no separators, no ``..``),
so a path never leaves its model's directory. Everything is written into a temporary directory beside its place,
fsynced and renamed into place: a server killed at any moment finds the previous state or the new one, whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from forge.learner.checkpoint import _fsync_tree
from forge.learner.tinker.types import Checkpoint, LoraSpec, NotFound, UserError

SCHEME = "tinker://"
KINDS: dict[str, Literal["training", "sampler"]] = {"weights": "training", "sampler_weights": "sampler"}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MODEL_FILE, STATE_FILE, OPTIMIZER_FILE = "model.json", "state.json", "optimizer.pt"
STAGING_PREFIX = ".staging-"


def check_name(name: str, what: str = "checkpoint name") -> str:
    """``name`` if it is a safe path component (letters, digits, ``.``, ``_``, ``-``; not starting with a dot and
    without ``..``), else UserError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise UserError(f"bad {what} {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter "
                        "or digit")
    return name


def new_model_id() -> str:
    return str(uuid.uuid4())


def checkpoint_path(model_id: str, segment: str, name: str) -> str:
    return f"{SCHEME}{model_id}/{segment}/{name}"


def parse_path(path: str) -> tuple[str, str, str]:
    """(model id, segment, name) of ``tinker://MODEL_ID/weights/NAME`` or ``.../sampler_weights/NAME``;
    UserError for anything else."""
    if not isinstance(path, str) or not path.startswith(SCHEME):
        raise UserError(f"not a tinker:// checkpoint path: {path!r}")
    parts = path[len(SCHEME):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS:
        raise UserError(f"a checkpoint path is tinker://MODEL_ID/weights/NAME or tinker://MODEL_ID/sampler_weights/"
                        f"NAME, not {path!r}")
    return check_name(parts[0], "model id"), parts[1], check_name(parts[2])


def write_atomically(final: Path, fill: Callable[[Path], None]) -> None:
    """Have ``fill`` write a directory, fsync it and rename it to ``final`` (replacing what was there)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f"{STAGING_PREFIX}new-{final.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        fill(staging)
        _fsync_tree(staging)
        old = None
        if final.exists():
            old = final.parent / f"{STAGING_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
        staging.rename(final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tree_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


class CheckpointStore:
    """The registry of models and their checkpoints under ``run_dir``."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir) / "models"
        self.root.mkdir(parents=True, exist_ok=True)
        self.recover()

    def recover(self) -> None:
        """Finish what a server killed mid-write left: a checkpoint moved aside to be replaced goes back to its
        place when its replacement never got there; unfinished, replaced and deleted copies are removed."""
        for folder in (f for segment in KINDS for f in self.root.glob(f"*/{segment}") if f.is_dir()):
            left = sorted(d for d in folder.iterdir() if d.name.startswith(STAGING_PREFIX))
            for directory in left:
                tag, _, rest = directory.name[len(STAGING_PREFIX):].partition("-")     # new, old or deleted
                name = rest.rpartition("-")[0] if tag == "old" else ""
                if name and not (folder / name).exists():
                    directory.rename(folder / name)
                    _fsync_dir(folder)
                else:
                    shutil.rmtree(directory, ignore_errors=True)

    def model_dir(self, model_id: str) -> Path:
        return self.root / check_name(model_id, "model id")

    # The registry.
    def register(self, model_id: str, owner: str, base_model: str, lora: LoraSpec) -> None:
        record = {"model_id": model_id, "owner": owner, "base_model": base_model, "lora": asdict(lora),
                  "created_unix": time.time()}

        directory = self.model_dir(model_id)
        directory.mkdir(parents=True, exist_ok=True)
        staging = directory / f"{STAGING_PREFIX}{MODEL_FILE}"
        with open(staging, "w") as file:
            file.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
            file.flush()
            os.fsync(file.fileno())
        staging.rename(directory / MODEL_FILE)
        _fsync_dir(directory)
        _fsync_dir(self.root)

    def records(self) -> list[dict]:
        """Every registered model's record (``register``'s), oldest first."""
        found = []
        for path in self.root.glob(f"*/{MODEL_FILE}"):
            if path.parent.name.startswith(STAGING_PREFIX):
                continue
            record = json.loads(path.read_text())
            record["lora"] = LoraSpec(**record["lora"])
            found.append(record)
        return sorted(found, key=lambda r: r["created_unix"])

    # Checkpoints.
    def directory(self, model_id: str, segment: str, name: str) -> Path:
        if segment not in KINDS:
            raise UserError(f"unknown checkpoint kind {segment!r}")
        return self.model_dir(model_id) / segment / check_name(name)

    def save(self, model_id: str, segment: str, name: str, fill: Callable[[Path], None]) -> Checkpoint:
        final = self.directory(model_id, segment, name)
        write_atomically(final, fill)
        return self.describe(model_id, segment, name)

    def find(self, path: str) -> tuple[str, str, Path]:
        """(model id, segment, directory) of the saved checkpoint ``path`` names; NotFound if there is none."""
        model_id, segment, name = parse_path(path)
        directory = self.directory(model_id, segment, name)
        if not directory.is_dir():
            raise NotFound(f"no checkpoint {path}")
        return model_id, segment, directory

    def describe(self, model_id: str, segment: str, name: str) -> Checkpoint:
        directory = self.directory(model_id, segment, name)
        return Checkpoint(model_id=model_id, checkpoint_id=f"{segment}/{name}", kind=KINDS[segment],
                          path=checkpoint_path(model_id, segment, name), size_bytes=_tree_size(directory),
                          created_unix=directory.stat().st_mtime)

    def list(self, model_id: str) -> list[Checkpoint]:
        found = []
        for segment in KINDS:
            folder = self.model_dir(model_id) / segment
            if folder.is_dir():
                found += [self.describe(model_id, segment, d.name) for d in folder.iterdir()
                          if d.is_dir() and not d.name.startswith(STAGING_PREFIX)]
        return sorted(found, key=lambda c: (c.created_unix, c.checkpoint_id))

    def delete(self, model_id: str, checkpoint_id: str) -> None:
        segment, _, name = checkpoint_id.partition("/")
        if segment not in KINDS:
            raise UserError(f"a checkpoint id is weights/NAME or sampler_weights/NAME, not {checkpoint_id!r}")
        directory = self.directory(model_id, segment, name)
        if not directory.is_dir():
            raise NotFound(f"no checkpoint {checkpoint_path(model_id, segment, name)}")
        trash = directory.parent / f"{STAGING_PREFIX}deleted-{name}-{uuid.uuid4().hex[:8]}"
        directory.rename(trash)
        _fsync_dir(directory.parent)
        shutil.rmtree(trash, ignore_errors=True)
