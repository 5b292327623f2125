"""Structured output: the grammar a completion must match, and which tokens may come next under it.

A grammar is a JSON schema (``{"type": "object"}`` for "any JSON object"), compiled by llguidance, the grammar
engine behind vLLM's ``guidance`` structured-output backend. Whitespace is fixed (compact, ``{"a":1,"b":2}``, as
vLLM's ``disable_any_whitespace``), so that a policy cannot wander into endless whitespace the grammar would allow.
The torch engine masks each token's logits with it; the vLLM backend asks vLLM for the same grammar on the same
backend with the same options; the learner replays it over the recorded completion to mask its logits
identically. All three compile through ``json_grammar``, so they agree token by token. llguidance rather than
xgrammar or outlines-core: one small wheel without a torch or CUDA dependency, masks computed on the host (what
both the engine and the learner need), and the backend vLLM's CPU build ships.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

ANY_OBJECT = '{"type": "object"}'
MAX_SCHEMA_BYTES = 64 * 1024
_CACHED_GRAMMARS = 64


class GrammarError(ValueError):
    """A grammar that cannot be compiled, or a token it does not allow."""


def json_grammar(json_schema: str) -> str:
    """The llguidance grammar of a JSON schema (JSON text), as every part of Forge compiles it."""
    import llguidance

    if len(json_schema.encode()) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"the JSON schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB")
    try:
        schema = json.loads(json_schema)
    except ValueError as exc:
        raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise GrammarError("a JSON schema must be an object (or true/false)")
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"the JSON schema cannot be compiled: {exc}") from None


def schema_problem(json_schema: str) -> str | None:
    """Why ``json_schema`` cannot constrain a completion, or None (checked without a tokenizer)."""
    import llguidance

    try:
        grammar = json_grammar(json_schema)
    except GrammarError as exc:
        return str(exc)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    return f"the JSON schema cannot be compiled: {error}" if error else None


class Matcher:
    """One completion's position in its grammar: the tokens allowed next, and the tokens taken so far."""

    def __init__(self, matcher, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._matcher = matcher
        self._words = (vocab_size + 31) // 32
        self._eos = frozenset(eos_token_ids)

    def allowed(self) -> np.ndarray:
        """The tokens allowed next as a bitmask (int32 [ceil(V / 32)], bit i of word w is token 32 w + i)."""
        mask = np.zeros(self._words, dtype=np.int32)
        self._matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        self._check()
        return mask

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""
        return 0 <= token < self._words * 32 and bool((int(self.allowed()[token // 32]) >> (token % 32)) & 1)

    def consume(self, token: int) -> None:
        """Take ``token``; a token the grammar does not allow is a GrammarError. A complete output stops the
        matcher, which then allows the end of sequence alone."""
        if self._matcher.is_stopped():
            if token in self._eos:
                return
            raise GrammarError(f"token {token} comes after the grammar's end")
        self._matcher.consume_token(token)
        self._check()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarError(self._matcher.get_error())


class Grammars:
    """Compiles grammars against one model's tokenizer (``tokenizer.json`` in ``directory``), built on first use;
    compiled grammars are cached by schema, and each completion gets its own copy. Thread-safe."""

    def __init__(self, directory: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.directory = Path(directory)
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._tokenizer = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, json_schema: str) -> Matcher:
        """A fresh matcher of ``json_schema`` at the start of a completion; GrammarError if it cannot compile."""
        with self._lock:
            compiled = self._compiled.get(json_schema)
            if compiled is None:
                compiled = self._compile(json_schema)
                self._compiled[json_schema] = compiled
                if len(self._compiled) > _CACHED_GRAMMARS:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(json_schema)
            return Matcher(compiled.deep_copy(), self.vocab_size, self.eos_token_ids)

    def _compile(self, json_schema: str):
        import llguidance

        if self._tokenizer is None:
            path = self.directory / "tokenizer.json"
            if not path.exists():
                raise GrammarError(f"structured output needs the model's tokenizer.json, not found in {self.directory}")
            self._tokenizer = llguidance.LLTokenizer(path.read_text(encoding="utf-8"), n_vocab=self.vocab_size,
                                                     eos_token=list(self.eos_token_ids))
        matcher = llguidance.LLMatcher(self._tokenizer, json_grammar(json_schema), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the JSON schema cannot be compiled: {matcher.get_error()}")
        return matcher


def unpack_bitmask(bits, vocab_size: int):
    """Bitmasks (int32 tensor [K, W]) as a boolean tensor [K, vocab_size] of allowed tokens."""
    import torch

    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    allowed = (bits.unsqueeze(-1) >> shifts) & 1
    return allowed.reshape(bits.shape[0], -1)[:, :vocab_size].bool()


__all__ = ["ANY_OBJECT", "GrammarError", "Grammars", "Matcher", "json_grammar", "schema_problem", "unpack_bitmask"]
