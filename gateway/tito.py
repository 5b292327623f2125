"""Token-in-token-out prompts: when a request's history contains earlier completions of its session, the prompt
reuses the ids that were fed and sampled then instead of re-tokenising their text.

The prompt text T is rendered with the chat template. The longest earlier call k whose text decode(prompt_k +
completion_k) is a prefix of T gives the prompt prompt_k + completion_k + encode(rest of T) (a splice). If none
matches whole (the client changed the text, or a stop string cut it), the longest run of call k's ids whose text
still begins T is reused (a partial splice); if that covers none of its sampled ids, T is encoded afresh (a
fallback). Either way the prompt decodes to exactly T.

How a session's calls are held: a call whose prompt begins with the previous call's ids (what a splice gives) keeps
only the ids after them and the text they add, linked to that call, so a session holds its context once, not once
per call, and each call decodes only its new ids. Where the tokenizer's decoder works token by token (``ByteLevel``,
``Metaspace``), the added text is decoded from a short window of the ids before it, with the window's own text
checked to end on a whole character and to begin the joined text; any other decoder, or a window that fails those
checks, decodes the whole call once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from forge.tokenizer import Tokenizer

FRESH, SPLICE, PARTIAL, FALLBACK = "fresh", "splice", "partial", "fallback"
LOCAL_DECODERS = frozenset({"ByteLevel", "Metaspace"})
WINDOW = 8          # ids before a call's new ones decoded with them to find the text they add


def decodes_locally(tokenizer: Tokenizer) -> bool:
    """Whether decode(a + b) is decode(a) followed by what b adds, judged from a short end of a."""
    return type(tokenizer.backend.decoder).__name__ in LOCAL_DECODERS


@dataclass(eq=False)
class CallMemo:
    """What the session's call ``index`` fed and sampled: the ids after those of ``base`` (None: all of them)."""

    index: int
    own: np.ndarray                 # int32
    prompt_len: int
    base: CallMemo | None = None    # the earlier call whose whole ids this call's begin with
    length: int = field(init=False)
    _text_base: CallMemo | None = field(default=None, init=False)   # the call whose text this call's text begins with
    _piece: str | None = field(default=None, init=False)            # the text after it
    _text_len: int = field(default=-1, init=False)

    def __post_init__(self) -> None:
        self.length = len(self.own) + (self.base.length if self.base is not None else 0)

    def ids(self) -> np.ndarray:
        """The call's prompt ids and completion ids, whole."""
        parts, memo = [], self
        while memo is not None:
            parts.append(memo.own)
            memo = memo.base
        return np.concatenate(parts[::-1]) if len(parts) > 1 else self.own

    def begins(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` begin with this call's whole ids, compared piece by piece along its chain (no copy)."""
        if not 0 < self.length <= len(ids):
            return False
        memo = self
        while memo is not None:
            start = memo.length - len(memo.own)
            if not np.array_equal(ids[start:memo.length], memo.own):
                return False
            memo = memo.base
        return True

    def last_ids(self, count: int) -> np.ndarray:
        parts, have, memo = [], 0, self
        while memo is not None and have < count:
            parts.append(memo.own[-(count - have):])
            have += len(parts[-1])
            memo = memo.base
        return np.concatenate(parts[::-1]) if parts else self.own[:0]

    def text_len(self, tokenizer: Tokenizer) -> int:
        self._decode(tokenizer)
        return self._text_len

    def text(self, tokenizer: Tokenizer) -> str:
        """decode(ids()), whole."""
        pieces, memo = [], self
        while memo is not None:
            memo._decode(tokenizer)
            pieces.append(memo._piece or "")
            memo = memo._text_base
        return "".join(pieces[::-1])

    def _decode(self, tokenizer: Tokenizer) -> None:
        """Find the text this call adds, its base's first (iteratively: a session's chain may be long)."""
        chain, memo = [], self
        while memo is not None and memo._text_len < 0:
            chain.append(memo)
            memo = memo.base
        for memo in reversed(chain):
            memo._decode_own(tokenizer)

    def _decode_own(self, tokenizer: Tokenizer) -> None:
        base = self.base
        if base is None:
            self._piece = tokenizer.decode(self.own.tolist())
            self._text_len = len(self._piece)
            return
        if decodes_locally(tokenizer):
            window = base.last_ids(WINDOW).tolist()
            head = tokenizer.decode(window)
            joined = tokenizer.decode(window + self.own.tolist())
            if head and not head.endswith("\ufffd") and joined.startswith(head):
                self._text_base, self._piece = base, joined[len(head):]
                self._text_len = base._text_len + len(self._piece)
                return
        whole = tokenizer.decode(self.ids().tolist())
        before = base.text(tokenizer)
        if whole.startswith(before):
            self._text_base, self._piece = base, whole[len(before):]
        else:
            self._piece = whole
        self._text_len = len(whole)


@dataclass(frozen=True)
class PromptBuild:
    ids: list[int]
    kind: str                   # fresh | splice | partial | fallback
    reused: int = 0             # ids taken from an earlier call
    source: int | None = None   # that call's index


def common_prefix_len(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CallHistory:
    """The recent calls of one session, for splicing."""

    def __init__(self, max_calls: int = 64) -> None:
        self.max_calls = max_calls
        self.calls: dict[int, CallMemo] = {}
        self._last: CallMemo | None = None          # the call added last: the next one most often extends it

    def __len__(self) -> int:
        return len(self.calls)

    def add(self, index: int, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> None:
        prompt = np.asarray(prompt_ids, dtype=np.int32)
        completion = np.asarray(completion_ids, dtype=np.int32)
        base = self._last if self._last is not None and self._last.begins(prompt) else None
        start = base.length if base is not None else 0
        memo = CallMemo(index, np.concatenate([prompt[start:], completion]), len(prompt), base)
        self.calls[index] = memo
        self._last = memo
        while len(self.calls) > self.max_calls:
            del self.calls[min(self.calls)]

    def extend(self, calls: Iterable[tuple[int, Sequence[int], Sequence[int]]]) -> None:
        for index, prompt_ids, completion_ids in calls:
            self.add(index, prompt_ids, completion_ids)

    def build(self, tokenizer: Tokenizer, text: str, has_history: bool = True) -> PromptBuild:
        """The prompt ids for ``text``; ``has_history``: the request carries earlier assistant turns. It may run in
        a worker thread while the loop adds calls: it works on a copy of the memos taken at once."""
        memos = list(self.calls.values())
        if not memos or not has_history:
            return PromptBuild(tokenizer.encode(text), FRESH)
        begins: dict[int, bool] = {}
        best: CallMemo | None = None
        for memo in memos:
            if self._begins(tokenizer, memo, text, begins) and (
                    best is None or memo.text_len(tokenizer) > best.text_len(tokenizer)):
                best = memo
        if best is not None:
            rest = text[best.text_len(tokenizer):]
            return PromptBuild(best.ids().tolist() + tokenizer.encode(rest), SPLICE, best.length, best.index)
        memo = max(memos, key=lambda m: common_prefix_len(text, m.text(tokenizer)))
        ids = memo.ids()
        reused = self._longest_prefix(tokenizer, ids, text)
        if reused <= memo.prompt_len:
            return PromptBuild(tokenizer.encode(text), FALLBACK)
        head = ids[:reused].tolist()
        rest = text[len(tokenizer.decode(head)):]
        return PromptBuild(head + tokenizer.encode(rest), PARTIAL, reused, memo.index)

    @staticmethod
    def _begins(tokenizer: Tokenizer, memo: CallMemo, text: str, begins: dict[int, bool]) -> bool:
        """Whether ``text`` begins with the memo's text, checked piece by piece along its chain (``begins``: what
        is known so far, by memo id)."""
        memo.text_len(tokenizer)
        chain, at = [], memo
        while at is not None and id(at) not in begins:
            chain.append(at)
            at = at._text_base
        ok = begins[id(at)] if at is not None else True
        for at in reversed(chain):
            start = at._text_base._text_len if at._text_base is not None else 0
            ok = ok and text.startswith(at._piece or "", start)
            begins[id(at)] = ok
        return ok

    @staticmethod
    def _longest_prefix(tokenizer: Tokenizer, ids: np.ndarray, text: str) -> int:
        """A (near-)longest j such that decode(ids[:j]) begins ``text`` (binary search)."""
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text.startswith(tokenizer.decode(ids[:mid].tolist())):
                lo = mid
            else:
                hi = mid - 1
        return lo
