"""Learner checkpoints as one component: the model in the Hugging Face layout (loadable by the actor and by
transformers; a LoRA run's adapters merged in, the adapter itself beside it as a PEFT directory), the optimizer, RNG
states and the trainer's state, including the pool cursor seq.

A checkpoint is written into a temporary directory, fsynced and renamed into place, then named in ``latest``
(replaced atomically): a learner killed at any moment finds either the previous complete checkpoint or the new
one, never a partial one. Only after that does the trainer commit the pool cursor, so the pool never forgets a
consume that the saved weights have not learned from.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forge.model import ModelConfig
from forge.model.checkpoint import save_state_dict

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@dataclass
class Restored:
    path: Path
    state: dict[str, Any]            # the trainer's state (step, version, pool_seq, …)

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def optimizer_path(self) -> Path:
        return self.path / "optimizer.pt"

    @property
    def adapter_dir(self) -> Path:
        """A LoRA run's adapter (a PEFT directory); absent for full fine-tuning."""
        return self.path / "adapter"


def _fsync_tree(directory: Path) -> None:
    for path in [*directory.rglob("*"), directory]:
        flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state().tolist(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3, tokenizer_dir: Path | None = None) -> None:
        self.directory = Path(directory)
        self.keep = max(1, keep)
        self.tokenizer_dir = tokenizer_dir

    def save(self, step: int, config: ModelConfig, model_state: dict[str, torch.Tensor],
             optimizer_state: dict[str, Any], trainer_state: dict[str, Any],
             adapter: Callable[[Path], Any] | None = None) -> Path:
        """Write step ``step`` completely and durably, then make it the latest (call on one rank). ``adapter``
        writes a LoRA run's adapter into the directory it is given."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step-{step:08d}"
        staging = self.directory / f".staging-{step:08d}"
        shutil.rmtree(staging, ignore_errors=True)
        save_state_dict(config, model_state, staging / "model")
        if self.tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (self.tokenizer_dir / name).exists():
                    shutil.copyfile(self.tokenizer_dir / name, staging / "model" / name)
        if adapter is not None:
            adapter(staging / "adapter")
        torch.save(optimizer_state, staging / "optimizer.pt")
        (staging / "trainer.json").write_text(json.dumps({**trainer_state, "step": step, "rng": rng_state()}))
        _fsync_tree(staging)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        pointer = self.directory / ".latest.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, self.directory / "latest")
        _fsync_tree(self.directory)
        self._prune()
        log.info("checkpoint %s written", final)
        return final

    def record_published(self, version: int) -> None:
        """Remember the newest weight version actors may hold, so a restarted learner never reuses a number."""
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / ".published.tmp"
        marker.write_text(str(version))
        os.replace(marker, self.directory / "published_version")

    def last_published(self) -> int:
        marker = self.directory / "published_version"
        return int(marker.read_text()) if marker.exists() else -1

    def latest(self) -> Restored | None:
        pointer = self.directory / "latest"
        if not pointer.exists():
            return None
        path = self.directory / pointer.read_text().strip()
        return Restored(path, json.loads((path / "trainer.json").read_text()))

    def _prune(self) -> None:
        steps = sorted(p for p in self.directory.glob("step-*") if p.is_dir())
        for old in steps[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
