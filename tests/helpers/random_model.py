"""A random-weight checkpoint of the tiny architecture (with the built-in tokenizer) for tests of the serving
machinery, whose expectations (no early end-of-sequence, arbitrary token splits) the trained model would not meet."""

from __future__ import annotations

from pathlib import Path

from forge.builtin import write_tiny_checkpoint


def random_tiny(directory: Path, seed: int = 0) -> Path:
    return write_tiny_checkpoint(directory / "random-tiny", seed)
