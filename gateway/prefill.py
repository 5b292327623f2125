"""The prefill pool of a disaggregated gateway: whether a call is prefilled apart, and on which prefill actor.

A call goes to the pool when its prompt has at least ``min_tokens`` tokens that its decode actor does not hold
already (as far as the router knows: the KV-aware routers track every actor's blocks; the others know nothing, and
then the whole prompt counts). Among the healthy prefill actors the one with the fewest prompt tokens queued wins
(a prefill's cost grows with its tokens), except that a session stays on the prefill actor that prefilled its last
call, whose prefix cache holds its earlier turns, while that one has no more than a prompt's worth of tokens queued
above the least busy."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from forge.gateway.routing.base import ActorEndpoint, candidates

MAX_HOMES = 100_000          # sessions whose prefill actor is remembered


class PrefillActor(Protocol):
    endpoint: ActorEndpoint
    healthy: bool
    in_flight: int


class PrefillPool:
    """The prefill actors (``actors``, a list that grows and shrinks as actors join and leave) and where their
    prefills go."""

    def __init__(self, actors: Sequence[PrefillActor], min_tokens: int = 64) -> None:
        self.actors = list(actors)
        self.min_tokens = min_tokens
        self.queued = {a.endpoint.address: 0 for a in self.actors}     # prompt tokens being prefilled, per actor
        self.homes: OrderedDict[str, str] = OrderedDict()
        self.counters = {"prefills": 0, "prefill_skipped": 0, "prefill_retries": 0, "handover_redone": 0,
                         "handover_fallbacks": 0}

    def wanted(self, prompt_tokens: int, cached_tokens: int | None) -> bool:
        """Whether a call goes to the pool (which has actors)."""
        if prompt_tokens - (cached_tokens or 0) >= self.min_tokens:
            return True
        self.counters["prefill_skipped"] += 1
        return False

    def choose(self, session_id: str, prompt_tokens: int, exclude: set[str]) -> PrefillActor:
        """The prefill actor for a call (NoActorAvailable when every one is excluded)."""
        allowed = candidates(self.actors, exclude)
        best = min(allowed, key=lambda a: (self.queued[a.endpoint.address], a.in_flight))
        home = self.homes.get(session_id)
        for actor in allowed:
            address = actor.endpoint.address
            if address == home and self.queued[address] <= self.queued[best.endpoint.address] + prompt_tokens:
                return actor
        return best

    def started(self, session_id: str, address: str, prompt_tokens: int) -> None:
        self.queued[address] += prompt_tokens
        self.counters["prefills"] += 1
        self.homes[session_id] = address
        self.homes.move_to_end(session_id)
        while len(self.homes) > MAX_HOMES:
            self.homes.popitem(last=False)

    def finished(self, address: str, prompt_tokens: int) -> None:
        if address in self.queued:          # not when the actor left the pool while the prefill ran
            self.queued[address] -= prompt_tokens

    def add(self, actor: PrefillActor) -> None:
        """A prefill actor joins the pool (the gateway found it in its actors directory)."""
        self.actors.append(actor)
        self.queued[actor.endpoint.address] = 0

    def remove(self, address: str) -> None:
        """The prefill actor at ``address`` leaves the pool: it gets no more prefills (those it runs may finish),
        and the sessions whose last prefill it made go to the least busy one."""
        self.actors[:] = [a for a in self.actors if a.endpoint.address != address]
        self.queued.pop(address, None)
        for session_id in [s for s, home in self.homes.items() if home == address]:
            del self.homes[session_id]

    def gauges(self) -> dict[str, float]:
        figures = {k: float(v) for k, v in self.counters.items()}
        figures.update({f"prefill_queued_tokens/{address}": float(n) for address, n in self.queued.items()})
        return figures
