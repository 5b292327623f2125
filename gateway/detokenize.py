"""Sampled ids to text as they arrive, with stop strings.

Text is decoded (unless only the final text is wanted) from the last clean boundary (a point where the decoded text ended in a complete character), so a
multi-byte character split across tokens is shown only once complete and streaming stays linear. Text that might
be the start of a stop string is held back; once a stop string appears the text is cut before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from forge.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class TextAssembler:
    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (), incremental: bool = True) -> None:
        self.tokenizer = tokenizer
        self.incremental = incremental
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self._clean = 0
        self._text = ""
        self._searched = 0
        self.stop_hit: str | None = None
        self._cut: int | None = None

    def feed(self, ids: Sequence[int]) -> None:
        """Add sampled ids (those that belong to the text: not the final end-of-sequence token)."""
        if self.stop_hit is not None or not ids:
            return
        self.ids.extend(ids)
        if not self.incremental:
            return
        tail = self.tokenizer.decode(self.ids[self._clean:])
        if tail and not tail.endswith(REPLACEMENT):
            self._text += tail
            self._clean = len(self.ids)
            self._find_stop(self._text)

    def _find_stop(self, text: str) -> None:
        if not self.stop:
            return
        longest = max(len(s) for s in self.stop)
        start = max(0, self._searched - longest + 1)
        found = [(i, s) for s in self.stop if (i := text.find(s, start)) >= 0]
        self._searched = len(text)
        if found:
            self._cut, self.stop_hit = min(found)

    def visible(self) -> str:
        """The text that is final already: complete characters, cut at a stop string, without a possible stop
        string's beginning at its end."""
        if self._cut is not None:
            return self._text[:self._cut]
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self._text)), hold, -1):
                if self._text.endswith(s[:k]):
                    hold = k
                    break
        return self._text[:len(self._text) - hold] if hold else self._text

    def final(self) -> str:
        """All the text, incomplete trailing characters included (as U+FFFD), cut at the first stop string."""
        if self._cut is None and self._clean < len(self.ids):
            self._text += self.tokenizer.decode(self.ids[self._clean:])
            self._clean = len(self.ids)
            self._find_stop(self._text)
        return self._text if self._cut is None else self._text[:self._cut]
