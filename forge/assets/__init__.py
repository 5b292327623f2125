"""Package data: the built-in models' architectures (config.json), weights, tokenizer and chat template.

``tiny`` is a dense Qwen3 of 1.15 M parameters; ``tiny-moe`` is the same shape with a mixture of 4 experts (top 2) in
every layer, whose active parameters per token equal the dense model's. Both share one tokenizer (``tiny-moe``
holds a copy of ``tiny``'s files, checked equal by the tests)."""

from __future__ import annotations

from pathlib import Path

ASSET_DIR = Path(__file__).resolve().parent
TINY_DIR = ASSET_DIR / "tiny"
TINY_NAME = "forge-tiny"
TINY_MOE_DIR = ASSET_DIR / "tiny-moe"
TINY_MOE_NAME = "forge-tiny-moe"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
