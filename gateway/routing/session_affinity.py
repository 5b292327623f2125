"""Session affinity for routers that do not keep sessions themselves: a wrapper that sends a session's calls to the
actor that served it (its KV prefix is cached there) and asks the wrapped router about new sessions only."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from forge.gateway.routing.base import ActorEndpoint, ActorView, Router, RouteRequest


class SessionAffinityRouter(Router):
    """Keeps a session on the actor that served it while that actor is healthy and allowed; otherwise asks the
    inner router and remembers its answer. Everything else goes to the inner router. Built by the gateway around
    a router without ``handles_session_affinity`` (not itself one of the routers ``--router`` names)."""

    handles_session_affinity = True

    def __init__(self, inner: Router, actors: Sequence[ActorView], max_sessions: int = 100_000) -> None:
        super().__init__(actors, session_affinity=True)
        self.inner = inner
        self.max_sessions = max_sessions
        self._home: OrderedDict[str, str] = OrderedDict()

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        home = self._home.get(request.session_id)
        if home is not None and home not in exclude:
            actor = next((a for a in self.actors if a.endpoint.address == home), None)
            if actor is not None and actor.healthy:
                self._home.move_to_end(request.session_id)
                return actor.endpoint
        chosen = self.inner.choose(request, exclude)
        if request.session_id:
            self._home[request.session_id] = chosen.address
            self._home.move_to_end(request.session_id)
            while len(self._home) > self.max_sessions:
                self._home.popitem(last=False)
        return chosen

    def forget(self, session_id: str) -> None:
        self._home.pop(session_id, None)
        self.inner.forget(session_id)

    async def start(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        await self.inner.start(metadata)

    async def close(self) -> None:
        await self.inner.close()

    def on_actor_added(self, view: ActorView) -> None:
        self.inner.on_actor_added(view)

    def on_actor_removed(self, address: str) -> None:
        """The sessions kept on ``address`` go where the inner router says at their next call."""
        for session_id in [s for s, home in self._home.items() if home == address]:
            del self._home[session_id]
        self.inner.on_actor_removed(address)

    def on_first_token(self, request: RouteRequest, address: str, ttft_s: float) -> None:
        self.inner.on_first_token(request, address, ttft_s)

    def on_done(self, request: RouteRequest, address: str) -> None:
        self.inner.on_done(request, address)

    def cached_tokens(self, request: RouteRequest) -> int | None:
        return self.inner.cached_tokens(request)

    def gauges(self) -> dict[str, float]:
        return self.inner.gauges()
