"""Package data: the built-in tiny model's architecture (config.json), tokenizer and chat template."""

from __future__ import annotations

from pathlib import Path

TINY_DIR = Path(__file__).resolve().parent / "tiny"
TINY_NAME = "forge-tiny"
