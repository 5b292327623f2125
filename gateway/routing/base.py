"""The one interface between the gateway and a router: the call it routes (``RouteRequest``), the actors it sees
(``ActorView``), what it answers (``ActorEndpoint``), and the abstract ``Router`` class with everything the gateway
calls on it."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol


class NoActorAvailable(Exception):
    """Every actor is excluded (already tried for this call) or there are none."""


@dataclass(frozen=True)
class ActorEndpoint:
    address: str                # host:port


@dataclass(frozen=True)
class RouteRequest:
    session_id: str
    prompt_ids: Sequence[int]
    max_tokens: int = 0
    group_id: str = ""          # the G rollouts of one prompt share it (cost-aware routers place them together)


class ActorView(Protocol):
    """An actor as a router sees it. The gateway's views (``forge.gateway.actors.ActorState``) also carry
    ``channel``, an asyncio gRPC channel to the actor, from before ``Router.start`` on."""

    endpoint: ActorEndpoint
    healthy: bool
    in_flight: int


def candidates(actors: Sequence[ActorView], exclude: set[str]) -> list[ActorView]:
    """Healthy actors not yet tried; if none is healthy, the untried others (they may have recovered)."""
    untried = [a for a in actors if a.endpoint.address not in exclude]
    if not untried:
        raise NoActorAvailable("no actor left to try" if actors else "no actors configured")
    return [a for a in untried if a.healthy] or untried


class Router(abc.ABC):
    """Picks the actor that serves each call.

    Constructor contract: the gateway builds every router as ``RouterClass(actors, session_affinity=flag)``.

    - ``actors``: the gateway's ``ActorView`` of each actor, in ``--actor`` order: a list that the gateway changes
      in place, from its event loop, as actors come and go (``--actors-dir``): an actor that joins is appended, one
      that is drained or dropped is removed. Keep the list itself, never a copy, and keep no positions in it across
      calls; its views change in place too (health, in-flight count). After each change the gateway calls
      ``on_actor_added(view)`` or ``on_actor_removed(address)``: a router that keeps something per actor creates it
      (or finds it missing and creates it) for an added actor, and drops it, and every session or group it placed
      there, for a removed one. The list may be empty (then ``choose`` raises ``NoActorAvailable``).
    - ``session_affinity``: whether calls of one session should stay on the actor that served the session (its KV
      prefix is cached there). A router that honours it itself sets ``handles_session_affinity``; otherwise, when
      it is on, the gateway wraps the router in ``SessionAffinityRouter``, which keeps a session on its actor while
      that actor is healthy and asks the router for new sessions only.

    Further constructor parameters must have defaults: the gateway passes nothing else. Everything the gateway
    calls is declared here; all but ``choose`` do nothing by default. The gateway calls the methods from its
    event loop's thread, so they must not block. ``on_first_token`` and ``on_done`` may name an actor that is no
    longer in the list: a call in flight on an actor that is drained finishes there after its removal.
    """

    handles_session_affinity: ClassVar[bool] = False

    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True) -> None:
        self.actors = actors
        self.session_affinity = session_affinity

    @abc.abstractmethod
    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        """The actor for ``request``, not one whose address is in ``exclude`` (those already tried for this call);
        raise ``NoActorAvailable`` when none is left (``candidates`` does)."""

    def forget(self, session_id: str) -> None:  # noqa: B027 - the defaults do nothing on purpose
        """The session ended: drop what was kept about it. Default: nothing."""

    async def start(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:  # noqa: B027
        """Called once on the gateway's event loop before the first call, after the actors' channels are open;
        ``metadata`` is the gRPC metadata the actors require (their API key), for calls the router makes to them.
        Actors that join later come through ``on_actor_added``. Default: nothing."""

    def on_actor_added(self, view: ActorView) -> None:  # noqa: B027
        """``view``, an actor that joined (its channel open), was just appended to ``actors``; called after
        ``start`` only. A router that talks to every actor itself (streams opened in ``start``) starts doing so
        with this one, in a task of its own (``asyncio.get_running_loop().create_task``): this must not block.
        Default: nothing."""

    def on_actor_removed(self, address: str) -> None:  # noqa: B027
        """The actor at ``address`` was just removed from ``actors``: drained (its ready file was removed) or
        dropped (unhealthy for too long). Forget what is kept about it, and move on from sessions and groups
        placed there; close what was opened to it (its channel is closed by the gateway once its calls are done).
        The same address may later be added again, as another process. Default: nothing."""

    async def close(self) -> None:  # noqa: B027
        """Called once when the gateway stops, before the actors' channels close. Default: nothing."""

    def on_first_token(self, request: RouteRequest, address: str, ttft_s: float) -> None:  # noqa: B027
        """The call's first token came ``ttft_s`` seconds after it was sent to ``address``. Default: nothing."""

    def on_done(self, request: RouteRequest, address: str) -> None:  # noqa: B027
        """The call's attempt on ``address`` ended: finished, failed, or moved to another actor (then ``choose``
        is asked again with ``address`` in ``exclude``). Default: nothing."""

    def cached_tokens(self, request: RouteRequest) -> int | None:
        """How many leading prompt tokens of ``request`` the best-placed actor holds in its KV cache, as far as the
        router knows (a disaggregated gateway skips the prefill pool when few remain); None: it does not know.
        Default: None."""
        return None

    def gauges(self) -> dict[str, float]:
        """Figures reported in the gateway's Stats beside its own. Default: none."""
        return {}
