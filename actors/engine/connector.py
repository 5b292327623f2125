"""What the torch engine's loop asks of the link that attaches itself to it (``l3.KVConnector``): hold a new request
while its prompt's blocks are fetched, hand back requests that are ready, learn from each step, hand a finished
prefill's blocks over, report figures. The engine knows this interface only, not the L3 cache behind it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forge.actors.backend import TokenChunk
    from forge.actors.engine.runner import Work
    from forge.actors.engine.sequence import Sequence


class EngineConnector(ABC):
    """Called on the engine thread, except ``stats`` and ``close``."""

    @property
    @abstractmethod
    def hands_over(self) -> bool:
        """Whether prefill-only requests can hand their prompt's blocks over (an L3 cache is attached)."""

    @abstractmethod
    def intercept(self, seq: Sequence) -> bool:
        """Hold a new request back (True) while its missing prompt blocks are looked up or fetched."""

    @abstractmethod
    def has_ready(self) -> bool:
        """Whether ``take_ready`` has something for the loop."""

    @abstractmethod
    def take_ready(self) -> list[Sequence]:
        """Held requests now ready to schedule, their fetched blocks installed."""

    @abstractmethod
    def after_step(self, work: list[Work], seconds: float) -> None:
        """Learn from one step of ``seconds`` over ``work``."""

    @abstractmethod
    def hand_over(self, seq: Sequence) -> Callable[[TokenChunk], None]:
        """For a prefill-only request as it finishes: how to deliver its final chunk once its blocks are handed
        over."""

    @abstractmethod
    def stats(self) -> dict[str, float]:
        """Named figures merged into the engine's own."""

    @abstractmethod
    def close(self) -> None: ...
