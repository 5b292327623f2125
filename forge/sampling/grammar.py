"""Structured output: the grammar a completion must match, and which tokens may come next under it.

A grammar is a JSON schema (``{"type": "object"}`` for "any JSON object") or a grammar in llguidance's Lark
dialect (a strict tool call's arguments between the template's fixed text), compiled by llguidance, the grammar
engine behind vLLM's ``guidance`` structured-output backend. JSON is laid out as ``json.dumps`` writes it (one
space after ``:`` and ``,``): no free whitespace a policy could wander into, and the layout chat templates render.
The torch engine masks each token's logits with it; the vLLM backend hands vLLM the same Lark text for its
guidance backend; the learner replays it over the recorded completion to mask its logits identically. All three
compile ``Grammar.lark()``, so they agree token by token. llguidance rather than
xgrammar or outlines-core: one small wheel without a torch or CUDA dependency, masks computed on the host (what
both the engine and the learner need), and the backend vLLM's CPU build ships.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from forge.sampling.bounds import lark_problem, schema_text_problem

ANY_OBJECT = '{"type": "object"}'
MAX_GRAMMAR_BYTES = 64 * 1024
_CACHED_GRAMMARS = 64
# JSON as json.dumps writes it (and chat templates' tojson): one space after ':' and ',', none elsewhere.
JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class GrammarError(ValueError):
    """A grammar that cannot be compiled, or a token it does not allow."""


@dataclass(frozen=True)
class Grammar:
    """What a completion must match: a JSON schema (JSON text), or a grammar in llguidance's Lark dialect (which
    may embed JSON schemas as ``%json {...}`` and special tokens as ``<[id]>``)."""

    kind: Literal["json_schema", "lark"]
    text: str

    def lark(self) -> str:
        """The grammar as Lark text: what the engine, the learner and vLLM compile alike."""
        if len(self.text.encode()) > MAX_GRAMMAR_BYTES:
            raise GrammarError(f"the {self.kind.replace('_', ' ')} is larger than {MAX_GRAMMAR_BYTES // 1024} KiB")
        if self.kind == "lark":
            return self.text
        return "start: " + json_lark(self.text)

    def bounds_problem(self) -> str | None:
        """Why the grammar is beyond the bounds every compiler of it keeps (``forge.sampling.bounds``), or None;
        cheap, and safe for any input: nothing is compiled."""
        if len(self.text.encode()) > MAX_GRAMMAR_BYTES:
            return f"the {self.kind.replace('_', ' ')} is larger than {MAX_GRAMMAR_BYTES // 1024} KiB"
        return schema_text_problem(self.text) if self.kind == "json_schema" else lark_problem(self.text)

    def problem(self) -> str | None:
        """Why the grammar cannot constrain a completion, or None: its bounds, then validated by llguidance without
        a tokenizer, in this process (a process serving the network compiles new grammars in
        ``forge.structured.sandbox`` first; this is what a backend checks beside it)."""
        import llguidance

        bounds = self.bounds_problem()
        if bounds is not None:
            return bounds
        try:
            compiled = llguidance.LLMatcher.grammar_from_lark(self.lark())
        except (GrammarError, ValueError) as exc:
            return str(exc)
        error = llguidance.LLMatcher.validate_grammar(compiled)
        return f"the {self.kind.replace('_', ' ')} cannot be compiled: {error}" if error else None


def json_lark(json_schema: str) -> str:
    """A Lark expression matching the JSON documents of ``json_schema`` (JSON text), laid out as ``JSON_LAYOUT``."""
    try:
        schema = json.loads(json_schema)
    except ValueError as exc:
        raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object (or true)")
    return "%json " + json.dumps({**schema, "x-guidance": {**schema.get("x-guidance", {}), **JSON_LAYOUT}})


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

    def matcher(self, grammar: Grammar) -> Matcher:
        """A fresh matcher of ``grammar`` at the start of a completion; GrammarError if it is beyond the bounds or
        cannot compile."""
        lark = grammar.lark()
        with self._lock:
            compiled = self._compiled.get(lark)
            if compiled is None:
                bounds = grammar.bounds_problem()
                if bounds is not None:
                    raise GrammarError(bounds)
                compiled = self._compile(lark)
                self._compiled[lark] = compiled
                if len(self._compiled) > _CACHED_GRAMMARS:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(lark)
            return Matcher(compiled.deep_copy(), self.vocab_size, self.eos_token_ids)

    def _compile(self, lark: str):
        import llguidance

        if self._tokenizer is None:
            path = self.directory / "tokenizer.json"
            if not path.exists():
                raise GrammarError(f"structured output needs the model's tokenizer.json, not found in {self.directory}")
            self._tokenizer = llguidance.LLTokenizer(path.read_text(encoding="utf-8"), n_vocab=self.vocab_size,
                                                     eos_token=list(self.eos_token_ids))
        try:
            matcher = llguidance.LLMatcher(self._tokenizer, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
        except ValueError as exc:
            raise GrammarError(f"the grammar cannot be compiled: {exc}") from None
        if matcher.is_error():
            raise GrammarError(f"the grammar cannot be compiled: {matcher.get_error()}")
        return matcher


def unpack_bitmask(bits, vocab_size: int):
    """Bitmasks (int32 tensor [K, W]) as a boolean tensor [K, vocab_size] of allowed tokens."""
    import torch

    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    allowed = (bits.unsqueeze(-1) >> shifts) & 1
    return allowed.reshape(bits.shape[0], -1)[:, :vocab_size].bool()


__all__ = ["ANY_OBJECT", "JSON_LAYOUT", "Grammar", "GrammarError", "Grammars", "Matcher", "json_lark",
           "unpack_bitmask"]
