"""The command that writes a random-weight Qwen3 checkpoint of a realistic shape
(``forge.checkpoints.random_qwen3``), for the benches and the backends' parity tests.

Usage: python -m forge.app.random_checkpoint OUT_DIR [--size 100m|small] [--seed 0]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from forge.checkpoints.random_qwen3 import SIZES, write_qwen3
from forge.cli.options import settings_command
from forge.settings import Settings, setting


@dataclass(frozen=True, kw_only=True)
class RandomCheckpointConfig(Settings):
    out: Path = setting(argument=True, path="dir", help="The checkpoint directory to write.")
    size: str = setting("100m", choices=tuple(sorted(SIZES)), help="The architecture's size.")
    seed: int = setting(0, help="Seed of the random weights.")


@settings_command("random-checkpoint", RandomCheckpointConfig)
def main(config: RandomCheckpointConfig) -> None:
    """Write a random-weight Qwen3 checkpoint to OUT."""
    click.echo(write_qwen3(config.out, config.size, config.seed))


if __name__ == "__main__":
    main()
