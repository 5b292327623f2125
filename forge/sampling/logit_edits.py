"""What is done to a token's logits before temperature and truncation, and how the actor and the learner agree on it.

In vLLM's order: ``min_tokens`` bans the stop and end-of-sequence ids (-inf) and a grammar masks the tokens that
cannot continue a valid output (-inf); ``logit_bias`` is added; the repetition penalty scales the logits of the
tokens in the prompt or in the completion so far (a positive logit divided by it, a negative one multiplied); the
frequency and presence penalties subtract ``frequency × count + presence`` from the logits of the tokens in the
completion so far. Each depends only on the call's sampling parameters, its prompt and the completion before the
token, so the learner rebuilds exactly the edits the actor made from the recorded call (``CompletionEdits``),
replaying the grammar over the sampled tokens.

``RowEdit`` is one row's edits; ``LogitEdits`` packs many rows' edits as sparse host arrays sorted by row (masks as
bitmasks), which batches slice, re-number and apply to logits on any device, differentiably.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from forge.sampling.grammar import Grammars, Matcher, unpack_bitmask
from forge.sampling.params import SamplingParams

_INT = np.int64
_FLOAT = np.float32


@dataclass
class RowEdit:
    """The edits of one row's logits (each set of ids without repeats)."""

    banned: np.ndarray | None = None        # ids set to -inf
    allowed: np.ndarray | None = None       # int32 bitmask [ceil(V / 32)]: the ids outside it are set to -inf
    bias_ids: np.ndarray | None = None      # logit_bias: added
    bias: np.ndarray | None = None
    repeated: np.ndarray | None = None      # ids the repetition penalty scales
    repetition: float = 1.0
    penalty_ids: np.ndarray | None = None   # frequency and presence penalties: subtracted
    penalty: np.ndarray | None = None

    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in ("banned", "allowed", "bias_ids", "repeated",
                                                             "penalty_ids"))


class CompletionEdits:
    """The edits of one call's logits, token by token: ``row()`` for the next token, ``consume(token)`` once it is
    taken. ``banned`` are the ids ``min_tokens`` keeps out of the first tokens; ``matcher`` follows the grammar."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], banned: Sequence[int] = (),
                 matcher: Matcher | None = None) -> None:
        self.params = params
        self.matcher = matcher
        self.taken = 0
        self._banned = np.asarray(sorted(set(banned)), dtype=_INT) if params.min_tokens and banned else None
        self._bias = (np.asarray([t for t, _ in params.logit_bias], dtype=_INT),
                      np.asarray([b for _, b in params.logit_bias], dtype=_FLOAT)) if params.logit_bias else None
        self._counts: Counter[int] = Counter()
        self._prompt = frozenset(prompt_ids) if params.repetition_penalty != 1.0 else frozenset()

    @staticmethod
    def needed(params: SamplingParams) -> bool:
        """Whether a call with ``params`` has any edits."""
        return bool(params.min_tokens or params.logit_bias or params.penalised)

    def row(self, ahead: int = 0) -> RowEdit | None:
        """The edits of the token ``ahead`` tokens after the next one (None: none). Only min_tokens and
        logit_bias can look ahead: the others depend on the tokens in between."""
        if ahead and self.params.penalised:
            raise ValueError("penalties and grammars depend on every token before: no edits ahead")
        params, edit = self.params, RowEdit()
        if self._banned is not None and self.taken + ahead < params.min_tokens:
            edit.banned = self._banned
        if self.matcher is not None:
            edit.allowed = self.matcher.allowed()
        if self._bias is not None:
            edit.bias_ids, edit.bias = self._bias
        if params.repetition_penalty != 1.0:
            seen = self._prompt.union(self._counts)
            if seen:
                edit.repeated = np.fromiter(sorted(seen), dtype=_INT, count=len(seen))
                edit.repetition = params.repetition_penalty
        if (params.frequency_penalty or params.presence_penalty) and self._counts:
            ids = sorted(self._counts)
            edit.penalty_ids = np.asarray(ids, dtype=_INT)
            counts = np.asarray([self._counts[i] for i in ids], dtype=np.float64)
            edit.penalty = (params.frequency_penalty * counts + params.presence_penalty).astype(_FLOAT)
        return None if edit.empty() else edit

    def consume(self, token: int) -> None:
        self.taken += 1
        if self.params.frequency_penalty or self.params.presence_penalty or self.params.repetition_penalty != 1.0:
            self._counts[token] += 1
        if self.matcher is not None:
            self.matcher.consume(token)

    def rows(self, completion: Iterable[int]) -> list[tuple[int, RowEdit]]:
        """The edits of every token of ``completion`` (from the start), as (index, edit) for those with any."""
        out = []
        for index, token in enumerate(completion):
            edit = self.row()
            if edit is not None:
                out.append((index, edit))
            self.consume(token)
        return out


def call_edits(params: SamplingParams, prompt_ids: Sequence[int], eos_token_ids: Sequence[int],
               grammars: Grammars | None) -> CompletionEdits | None:
    """The edits of a call with ``params`` (None when it has none). ``min_tokens`` bans the call's stop ids and the
    model's end-of-sequence ids, ``ignore_eos`` or not, as vLLM does."""
    if not CompletionEdits.needed(params):
        return None
    matcher = None
    if params.grammar is not None:
        if grammars is None:
            raise ValueError("structured output needs the model's tokenizer to compile its grammar")
        matcher = grammars.matcher(params.grammar)
    return CompletionEdits(params, prompt_ids, (*params.stop_token_ids, *eos_token_ids), matcher)


def _pairs(rows: list[tuple[int, RowEdit]], ids: str, values: str | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    picked = [(row, getattr(edit, ids), getattr(edit, values) if values else None) for row, edit in rows
              if getattr(edit, ids) is not None]
    if not picked:
        return None
    row_ids = np.concatenate([np.full(len(i), row, dtype=_INT) for row, i, _ in picked])
    token_ids = np.concatenate([i for _, i, _ in picked]).astype(_INT)
    vals = np.concatenate([np.asarray(v, dtype=_FLOAT) for _, _, v in picked]) if values else None
    return row_ids, token_ids, vals


def _parts(edits: dict) -> list[tuple]:
    return [part for part in edits.values() if part is not None]


@dataclass
class LogitEdits:
    """Many rows' edits as host arrays, each sorted by row: (rows, ids[, values]) triples and bitmask rows."""

    banned: tuple[np.ndarray, np.ndarray, None] | None = None
    allowed: tuple[np.ndarray, np.ndarray] | None = None            # (rows [K], bitmasks [K, W])
    bias: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    repeated: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # values: each pair's penalty
    penalty: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def of_rows(cls, rows: list[tuple[int, RowEdit]]) -> LogitEdits | None:
        """The edits of (row, edit) pairs, rows increasing; None when there are none."""
        if not rows:
            return None
        masked = [(row, edit.allowed) for row, edit in rows if edit.allowed is not None]
        repeated = _pairs(rows, "repeated")
        if repeated is not None:
            factor = {row: edit.repetition for row, edit in rows}
            repeated = (repeated[0], repeated[1],
                        np.asarray([factor[r] for r in repeated[0].tolist()], dtype=_FLOAT))
        edits = cls(banned=_pairs(rows, "banned"),
                    allowed=(np.asarray([r for r, _ in masked], dtype=_INT), np.stack([m for _, m in masked]))
                    if masked else None,
                    bias=_pairs(rows, "bias_ids", "bias"), repeated=repeated,
                    penalty=_pairs(rows, "penalty_ids", "penalty"))
        return edits if edits.any() else None

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def renumbered(self, new_rows: np.ndarray) -> LogitEdits:
        """The same edits with row r moved to ``new_rows[r]`` (distinct rows), sorted by their new rows."""
        def move(part):
            if part is None:
                return None
            rows = np.asarray(new_rows, dtype=_INT)[part[0]]
            order = np.argsort(rows, kind="stable")
            return (rows[order], *(p[order] if p is not None else None for p in part[1:]))
        return LogitEdits(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def shifted(self, offset: int) -> LogitEdits:
        def move(part):
            return None if part is None else (part[0] + offset, *part[1:])
        return LogitEdits(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def select(self, lo: int, hi: int) -> LogitEdits | None:
        """The edits of rows [lo, hi), rows counted from ``lo``; None when there are none."""
        def cut(part):
            if part is None:
                return None
            first, last = np.searchsorted(part[0], (lo, hi))
            if first == last:
                return None
            return (part[0][first:last] - lo, *(p[first:last] if p is not None else None for p in part[1:]))
        edits = LogitEdits(**{f.name: cut(getattr(self, f.name)) for f in fields(self)})
        return edits if edits.any() else None

    @staticmethod
    def concat(parts: Iterable[LogitEdits | None]) -> LogitEdits | None:
        """The edits of every part (each of its own rows), sorted by row."""
        present = [p for p in parts if p is not None]
        if not present:
            return None
        merged = {}
        for f in fields(LogitEdits):
            pieces = [getattr(p, f.name) for p in present if getattr(p, f.name) is not None]
            merged[f.name] = None if not pieces else tuple(
                None if pieces[0][i] is None else np.concatenate([piece[i] for piece in pieces])
                for i in range(len(pieces[0])))
        return LogitEdits(**merged).renumbered(np.arange(1 + max(int(p[0].max()) for p in _parts(merged))))

    def apply(self, logits: Tensor) -> Tensor:
        """``logits`` [N, V] edited (a new tensor; gradients flow through the values kept)."""
        device, minus_inf = logits.device, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)

        def index(part) -> tuple[Tensor, Tensor]:
            return torch.from_numpy(part[0]).to(device), torch.from_numpy(part[1]).to(device)

        if self.banned is not None:
            logits = logits.index_put(index(self.banned), minus_inf)
        if self.allowed is not None:
            rows = torch.from_numpy(self.allowed[0]).to(device)
            allowed = unpack_bitmask(torch.from_numpy(self.allowed[1]).to(device), logits.shape[-1])
            logits = logits.index_put((rows,), logits[rows].masked_fill(~allowed, float("-inf")))
        if self.bias is not None:
            logits = logits.index_put(index(self.bias), torch.from_numpy(self.bias[2]).to(logits), accumulate=True)
        if self.repeated is not None:
            where = index(self.repeated)
            values, factor = logits[where], torch.from_numpy(self.repeated[2]).to(logits)
            logits = logits.index_put(where, torch.where(values > 0, values / factor, values * factor))
        if self.penalty is not None:
            logits = logits.index_put(index(self.penalty), -torch.from_numpy(self.penalty[2]).to(logits),
                                      accumulate=True)
        return logits


__all__ = ["CompletionEdits", "LogitEdits", "RowEdit", "call_edits"]
