"""The most characters of text that one token can stand for, read from a tokenizer's pipeline: with it, a prompt
text of L characters takes at least ceil(L / N) tokens, so a text longer than (context - 1) x N characters cannot
fit the context and is refused without being tokenised.

A token covers its vocabulary piece: a byte-level piece has one character per byte (so at least one per character
it covers), a byte-fallback piece such as ``<0x41>`` one byte, a Metaspace piece its characters with ``▁`` for a
space. The bound only holds when nothing before the model drops text: a normalizer may only shrink it by a known
factor (NFC and NFKC compose at most four code points into one), no pre-tokenizer may remove characters, and the
model may not swallow a run of unknown characters in one token (a WordPiece ``[UNK]`` word, a fused unknown).
Where that cannot be shown, there is no bound (None) and only the token count decides."""

from __future__ import annotations

import json
from typing import Any

from forge.tokenizer import Tokenizer

NORMALIZERS_KEEPING_LENGTH = frozenset({"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"})
NORMALIZERS_COMPOSING = frozenset({"NFC", "NFKC"})
MAX_CODE_POINTS_COMPOSED = 4          # the longest canonical decomposition (e.g. U+1F82) is four code points
PRE_TOKENIZERS_KEEPING_TEXT = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts",
                                         "Split", "FixedLength"})


def normalizer_shrink(spec: dict[str, Any] | None) -> int | None:
    """How many characters of input at most become one character of normalized text (None: no bound)."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for part in spec.get("normalizers", []):
            shrink = normalizer_shrink(part)
            if shrink is None:
                return None
            factor *= shrink
        return factor
    if kind in NORMALIZERS_KEEPING_LENGTH:
        return 1
    if kind in NORMALIZERS_COMPOSING:
        return MAX_CODE_POINTS_COMPOSED
    if kind == "Replace":
        pattern, content = spec.get("pattern", {}).get("String"), spec.get("content", "")
        if isinstance(pattern, str) and pattern and content:
            return -(-len(pattern) // len(content))
    return None


def pre_tokenizer_keeps_text(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(pre_tokenizer_keeps_text(part) for part in spec.get("pretokenizers", []))
    if kind in ("Split", "Punctuation") and spec.get("behavior") == "Removed":
        return False
    return kind in PRE_TOKENIZERS_KEEPING_TEXT


def _byte_level(spec: dict[str, Any] | None, key: str) -> bool:
    if spec is None:
        return False
    if spec.get("type") == "ByteLevel":
        return True
    return any(_byte_level(part, key) for part in spec.get(key, []))


def model_covers_every_character(pipeline: dict[str, Any]) -> bool:
    """Every character reaches the ids through pieces of its own (no unknown run fused into one token)."""
    model = pipeline.get("model", {})
    if model.get("byte_fallback"):
        return True
    if model.get("type") != "BPE":
        return False
    if _byte_level(pipeline.get("pre_tokenizer"), "pretokenizers") or \
            _byte_level(pipeline.get("normalizer"), "normalizers"):
        return True
    return model.get("unk_token") is not None and not model.get("fuse_unk")


def chars_per_token(tokenizer: Tokenizer) -> int | None:
    """The most characters of (raw, unnormalized) text that one token can cover, or None if it has no bound."""
    pipeline = json.loads(tokenizer.backend.to_str())
    shrink = normalizer_shrink(pipeline.get("normalizer"))
    if shrink is None or not pre_tokenizer_keeps_text(pipeline.get("pre_tokenizer")) or \
            not model_covers_every_character(pipeline):
        return None
    longest = max(len(piece) for piece in tokenizer.backend.get_vocab(with_added_tokens=True))
    return longest * shrink
