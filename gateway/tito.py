"""Token-in-token-out prompts: when a request's history contains earlier completions of its session, the prompt
reuses the ids that were fed and sampled then instead of re-tokenising their text.

The prompt text T is rendered with the chat template. The longest earlier call k whose text decode(prompt_k +
completion_k) is a prefix of T gives the prompt prompt_k + completion_k + encode(rest of T) (a splice). If none
matches whole (the client changed the text, or a stop string cut it), the longest run of call k's ids whose text
still begins T is reused (a partial splice); if that covers none of its sampled ids, T is encoded afresh (a
fallback). Either way the prompt decodes to exactly T.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from forge.tokenizer import Tokenizer

FRESH, SPLICE, PARTIAL, FALLBACK = "fresh", "splice", "partial", "fallback"


@dataclass
class CallMemo:
    """What the session's call ``index`` fed and sampled."""

    index: int
    ids: array                  # prompt ids + completion ids
    prompt_len: int
    text: str | None = None     # decode(ids), computed on first use

    def decoded(self, tokenizer: Tokenizer) -> str:
        if self.text is None:
            self.text = tokenizer.decode(self.ids.tolist())
        return self.text


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

    def __len__(self) -> int:
        return len(self.calls)

    def add(self, index: int, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> None:
        ids = array("i", prompt_ids)
        ids.extend(completion_ids)
        self.calls[index] = CallMemo(index, ids, len(prompt_ids))
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
        best: CallMemo | None = None
        for memo in memos:
            decoded = memo.decoded(tokenizer)
            if text.startswith(decoded) and (best is None or len(decoded) > len(best.text or "")):
                best = memo
        if best is not None:
            rest = text[len(best.text or ""):]
            return PromptBuild(best.ids.tolist() + tokenizer.encode(rest), SPLICE, len(best.ids), best.index)
        memo = max(memos, key=lambda m: common_prefix_len(text, m.decoded(tokenizer)))
        reused = self._longest_prefix(tokenizer, memo, text)
        if reused <= memo.prompt_len:
            return PromptBuild(tokenizer.encode(text), FALLBACK)
        head = memo.ids[:reused].tolist()
        rest = text[len(tokenizer.decode(head)):]
        return PromptBuild(head + tokenizer.encode(rest), PARTIAL, reused, memo.index)

    @staticmethod
    def _longest_prefix(tokenizer: Tokenizer, memo: CallMemo, text: str) -> int:
        """A (near-)longest j such that decode(ids[:j]) begins ``text`` (binary search)."""
        lo, hi = 0, len(memo.ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text.startswith(tokenizer.decode(memo.ids[:mid].tolist())):
                lo = mid
            else:
                hi = mid - 1
        return lo
