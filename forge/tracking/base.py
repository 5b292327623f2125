"""The interface every experiment tracker implements: a run opened by its constructor, then its settings, its
metrics step by step and tables of rows, and its end."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any


class Tracker(ABC):
    """One run in one tracker. ``step`` is the learner's step; the metrics of one step come in one call."""

    name: str = ""

    @abstractmethod
    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's settings, as plain JSON (nested dicts of numbers, strings, lists)."""

    @abstractmethod
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Scalars at ``step`` (names like ``learner/loss``)."""

    @abstractmethod
    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """A table at ``step``: rows with the same keys, values numbers or text."""

    @abstractmethod
    def close(self) -> None:
        """End the run, with everything logged flushed."""
