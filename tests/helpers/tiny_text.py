"""Shared by the gateway's unit tests: the built-in model's tokenizer, a tool to call, and a text's ids split the way a
sampler may produce them."""

from __future__ import annotations

from forge.assets import TINY_DIR
from forge.tokenizer import Tokenizer

TOK = Tokenizer.from_dir(TINY_DIR)
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


def split_ids(text: str) -> list[int]:
    """Ids of ``text`` tokenised piece by piece: a valid but non-canonical split, as a sampler may produce."""
    ids: list[int] = []
    for i in range(0, len(text), 2):
        ids += TOK.encode(text[i:i + 2])
    return ids
