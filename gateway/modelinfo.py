"""What the gateway needs of the served model: its tokenizer and chat template, its context length, the longest
prompt text that can fit it, and the byte content of each token (for OpenAI logprobs). Loaded from a model
reference (a checkpoint directory, a Hugging Face id found in the cache, or 'tiny', see
forge.checkpoints.resolve_model) without torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from forge.checkpoints import resolve_model
from forge.gateway.prompt_limits import PromptLimits
from forge.gateway.token_bound import chars_per_token
from forge.tokenizer import Tokenizer


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, char -> byte (the inverse of bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@dataclass
class ModelInfo:
    tokenizer: Tokenizer
    context_length: int
    model_id: str
    chars_per_token: int | None = None      # the most characters one token covers (None: no sound bound)
    eos_token_ids: tuple[int, ...] = ()     # the model's end-of-sequence ids (config.json)
    model_type: str | None = None           # config.json's model_type (llama, qwen3_moe, ...)
    directory: Path | None = None           # the checkpoint's directory (tokenizer.json: grammars compile with it)

    @classmethod
    def load(cls, model: str) -> ModelInfo:
        """Raises forge.checkpoints.ModelNotFound (a ValueError) for a bad reference, FileNotFoundError for a checkpoint without a
        tokenizer.json, ValueError for one without a context length."""
        ref = resolve_model(model)
        path = ref.directory
        if not (path / "tokenizer.json").exists():
            raise FileNotFoundError(f"{model}: no tokenizer.json in {path} (the gateway needs the model's tokenizer)")
        tokenizer = Tokenizer.from_dir(path)
        config = json.loads((path / "config.json").read_text())
        context = config.get("max_position_embeddings") or tokenizer.config.get("model_max_length")
        if not isinstance(context, int) or context <= 1:
            raise ValueError(f"{path}: no context length (max_position_embeddings in config.json)")
        eos = config.get("eos_token_id")
        eos_ids = (eos,) if isinstance(eos, int) else tuple(i for i in eos or () if isinstance(i, int))
        model_type = config.get("model_type")
        return cls(tokenizer, context, ref.model_id, chars_per_token(tokenizer), eos_ids,
                   model_type if isinstance(model_type, str) else None, path)

    @property
    def limits(self) -> PromptLimits:
        return PromptLimits(self.context_length, self.chars_per_token)

    @property
    def max_prompt_chars(self) -> int | None:
        """The longest prompt text (in characters) that may still fit the context with room for one new token."""
        return self.limits.max_prompt_chars

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def end_texts(self) -> tuple[str, ...]:
        """The texts of the end-of-sequence tokens (the model's, and the tokenizer's own): where a turn ends."""
        ids = [*self.eos_token_ids, *([self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None
                                      else [])]
        return tuple(dict.fromkeys(self.tokenizer.decode([i]) for i in ids if 0 <= i < self.vocab_size))

    def token_bytes(self, token_id: int) -> bytes:
        return _token_bytes(self.tokenizer, token_id)


@lru_cache(maxsize=1)
def _decoder_table() -> dict[str, int]:
    return _byte_decoder()


def _token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    piece = tokenizer.id_to_token(token_id)
    if piece is None:
        return b""
    table = _decoder_table()
    if "ByteLevel" in repr(tokenizer.backend.decoder) and all(ch in table for ch in piece):
        return bytes(table[ch] for ch in piece)
    return tokenizer.decode([token_id]).encode()
