"""Token-in-token-out prompts: when a request's history contains earlier completions of its session, the prompt
reuses the ids that were fed and sampled then instead of re-tokenising their text.

The prompt text T is rendered with the chat template. The longest earlier call k whose text decode(prompt_k +
completion_k) is a prefix of T gives the prompt prompt_k + completion_k + encode(rest of T) (a splice). If none
matches whole (the client changed the text, or a stop string cut it), the longest run of call k's ids whose text
still begins T is reused (a partial splice); if that covers none of its sampled ids, T is encoded afresh (a
fallback). Either way the prompt decodes to exactly T.

How a session's calls are held: the calls that each extend the one before (what a splice gives) share one line, an
array grown by doubling that holds their ids once, each call a length into it; their text is one string, each call a
length into it. So a session holds its context once, a call adds only its new ids and decodes only the text they add,
and whether a prompt extends the last call, or a text begins with a call's text, is one comparison, not a walk over
the session's calls. A call that does not extend the last one starts a line of its own. Where the tokenizer's decoder
works token by token (``ByteLevel``, ``Metaspace``), the added text is decoded from a short window of the ids before
it, with the window's own text checked to end on a whole character and to begin the joined text; any other decoder,
or a window that fails those checks, decodes the whole call once, and a call whose whole text does not extend the
text before it starts a text of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from forge.tokenizer import Tokenizer

FRESH, SPLICE, PARTIAL, FALLBACK = "fresh", "splice", "partial", "fallback"
LOCAL_DECODERS = frozenset({"ByteLevel", "Metaspace"})
WINDOW = 8          # ids before a call's new ones decoded with them to find the text they add
UNKNOWN = 1 << 62   # a text length not known not to begin a text


def decodes_locally(tokenizer: Tokenizer) -> bool:
    """Whether decode(a + b) is decode(a) followed by what b adds, judged from a short end of a."""
    return type(tokenizer.backend.decoder).__name__ in LOCAL_DECODERS


class IdsLine:
    """The ids of calls that each extend the one before: one array, grown by doubling. Only its end is ever written,
    so a view of a call's ids stays what it was while later calls are added (from another thread too)."""

    __slots__ = ("buffer", "length", "lock")

    def __init__(self, ids: np.ndarray) -> None:
        self.buffer = ids
        self.length = len(ids)
        self.lock = threading.Lock()        # decoding its calls' text, which may run in worker threads

    def append(self, ids: np.ndarray) -> None:
        end = self.length + len(ids)
        if end > len(self.buffer):
            grown = np.empty(max(end, 2 * len(self.buffer)), dtype=np.int32)
            grown[:self.length] = self.buffer[:self.length]
            self.buffer = grown
        self.buffer[self.length:end] = ids
        self.length = end


class TextLine:
    """decode() of the last call of a run of calls whose text each extends the one before. Only that call's successor
    (the one call that extends it: ``CallHistory.add`` extends only the call added last) ever extends it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def extend(self, piece: str) -> None:
        self.text = self.text + piece       # a new string: a reader in another thread sees the old or the new one


@dataclass(eq=False)
class CallMemo:
    """What the session's call ``index`` fed and sampled: ``line``'s first ``length`` ids, its own from ``start``."""

    index: int
    line: IdsLine
    start: int                          # the ids of the call it extends (0: it extends none)
    length: int
    prompt_len: int
    previous: CallMemo | None = None    # the call it extends, until this call's text is decoded
    _text: TextLine | None = field(default=None, init=False)
    _text_len: int = field(default=-1, init=False)

    @property
    def own(self) -> np.ndarray:
        """The ids this call added: all of them where it extends no earlier call."""
        return self.line.buffer[self.start:self.length]

    def ids(self) -> np.ndarray:
        """The call's prompt ids and completion ids, whole (a read-only view)."""
        view = self.line.buffer[:self.length]
        view.flags.writeable = False
        return view

    def begins(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` begin with this call's whole ids."""
        return 0 < self.length <= len(ids) and np.array_equal(ids[:self.length], self.line.buffer[:self.length])

    def text_len(self, tokenizer: Tokenizer) -> int:
        self._decode(tokenizer)
        return self._text_len

    def text(self, tokenizer: Tokenizer) -> str:
        """decode(ids()), whole."""
        self._decode(tokenizer)
        return self._text.text[:self._text_len]

    def _decode(self, tokenizer: Tokenizer) -> None:
        """Find the text this call adds, the undecoded calls before it first (oldest first)."""
        if self._text_len >= 0:
            return
        with self.line.lock:
            chain, memo = [], self
            while memo is not None and memo._text_len < 0:
                chain.append(memo)
                memo = memo.previous
            for memo in reversed(chain):
                memo._decode_own(tokenizer)
                memo.previous = None            # its text known, it needs the call before it no longer

    def _decode_own(self, tokenizer: Tokenizer) -> None:
        previous = self.previous
        if previous is None:                    # the first of its line, or one whose line was never decoded before
            self._text = TextLine(tokenizer.decode(self.ids().tolist()))
            self._text_len = len(self._text.text)
            return
        before = previous._text_len
        if decodes_locally(tokenizer):
            window = self.line.buffer[max(0, self.start - WINDOW):self.start].tolist()
            head = tokenizer.decode(window)
            joined = tokenizer.decode(window + self.own.tolist())
            if head and not head.endswith("\ufffd") and joined.startswith(head):
                self._extend(previous, joined[len(head):])
                return
        whole = tokenizer.decode(self.ids().tolist())
        if whole.startswith(previous._text.text):     # the previous call's text ends its line
            self._extend(previous, whole[before:])
        else:
            self._text, self._text_len = TextLine(whole), len(whole)

    def _extend(self, previous: CallMemo, piece: str) -> None:
        """This call's text: the previous call's, whose line it ends, and ``piece``."""
        previous._text.extend(piece)
        self._text, self._text_len = previous._text, previous._text_len + len(piece)


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
        last = self._last
        if last is not None and last.begins(prompt):
            line = last.line                    # ``last`` ends it: each call extends only the one added before it
            line.append(prompt[last.length:])
            line.append(completion)
            memo = CallMemo(index, line, last.length, line.length, len(prompt), last)
        else:
            line = IdsLine(np.concatenate([prompt, completion]))
            memo = CallMemo(index, line, 0, line.length, len(prompt))
        self.calls[index] = memo
        self._last = memo
        while len(self.calls) > self.max_calls:
            del self.calls[min(self.calls)]
            self.calls[min(self.calls)].previous = None     # undecoded, it decodes whole if asked: the rest let go

    def extend(self, calls: Iterable[tuple[int, Sequence[int], Sequence[int]]]) -> None:
        for index, prompt_ids, completion_ids in calls:
            self.add(index, prompt_ids, completion_ids)

    def build(self, tokenizer: Tokenizer, text: str, has_history: bool = True) -> PromptBuild:
        """The prompt ids for ``text``; ``has_history``: the request carries earlier assistant turns. It may run in
        a worker thread while the loop adds calls: it works on a copy of the memos taken at once."""
        memos = list(self.calls.values())
        if not memos or not has_history:
            return PromptBuild(tokenizer.encode(text), FRESH)
        known: dict[int, list[int]] = {}
        best: CallMemo | None = None
        for memo in memos:
            if self._begins(tokenizer, memo, text, known) and (
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
    def _begins(tokenizer: Tokenizer, memo: CallMemo, text: str, known: dict[int, list[int]]) -> bool:
        """Whether ``text`` begins with the memo's text. ``known``, by text line: how much of its text is known to
        begin ``text``, and a length known not to (the calls of a line are its prefixes: the memos come oldest first,
        so each check compares only the text added since the last one, once the whole line was found not to match)."""
        end = memo.text_len(tokenizer)
        line = memo._text
        state = known.get(id(line))
        if state is None:
            whole = line.text
            state = known[id(line)] = [len(whole), UNKNOWN] if text.startswith(whole) else [0, len(whole)]
        matched, unmatched = state
        if end <= matched:
            return True
        if end >= unmatched:
            return False
        ok = text.startswith(line.text[matched:end], matched)
        state[0 if ok else 1] = end
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
