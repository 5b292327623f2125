"""The actors behind the gateway: one asyncio gRPC channel each, health checks, in-flight counts, and generation
streams that move to another actor when one fails before its first token (after it, the call fails)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from forge.gateway.errors import BadRequest, Unavailable, UpstreamFailed
from forge.gateway.routing import ActorEndpoint, NoActorAvailable, Router, RouteRequest, make_router
from forge.rpc.auth import bearer_metadata
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
ERROR, ABORT = common_pb2.FINISH_REASON_ERROR, common_pb2.FINISH_REASON_ABORT


@dataclass
class ActorState:
    endpoint: ActorEndpoint
    healthy: bool = True
    in_flight: int = 0
    calls: int = 0
    failures: int = 0
    stub: actor_pb2_grpc.ActorStub | None = None
    health: health_pb2_grpc.HealthStub | None = None
    channel: grpc.aio.Channel | None = None


class _Retry(Exception):
    pass


class ActorSet:
    def __init__(self, addresses: Sequence[str], router: str = "least-loaded", session_affinity: bool = True,
                 api_key: str | None = None, health_interval_s: float = 2.0) -> None:
        if not addresses:
            raise ValueError("no actors: give at least one --actor host:port")
        self.actors = [ActorState(ActorEndpoint(a)) for a in dict.fromkeys(addresses)]
        self.by_address = {a.endpoint.address: a for a in self.actors}
        self.router: Router = make_router(router, self.actors, session_affinity)
        self.router_name = router
        self.metadata = bearer_metadata(api_key)
        self.health_interval_s = health_interval_s
        self.retries = 0
        self._health_task: asyncio.Task | None = None

    async def start(self) -> None:
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.keepalive_time_ms", 30_000),
                   ("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 5_000)]
        for actor in self.actors:
            actor.channel = grpc.aio.insecure_channel(actor.endpoint.address, options=options)
            actor.stub = actor_pb2_grpc.ActorStub(actor.channel)
            actor.health = health_pb2_grpc.HealthStub(actor.channel)
        self._health_task = asyncio.create_task(self._watch_health(), name="actor-health")
        await self.router.start(self.metadata)

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
        await self.router.close()
        for actor in self.actors:
            if actor.channel is not None:
                await actor.channel.close(grace=None)

    async def _check(self, actor: ActorState) -> None:
        try:
            response = await actor.health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            healthy = response.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.aio.AioRpcError:
            healthy = False
        if healthy != actor.healthy:
            log.log(logging.INFO if healthy else logging.WARNING, "actor %s is %s", actor.endpoint.address,
                    "healthy again" if healthy else "unhealthy")
        actor.healthy = healthy

    async def _watch_health(self) -> None:
        while True:
            await asyncio.gather(*(self._check(a) for a in self.actors))
            await asyncio.sleep(self.health_interval_s)

    def call(self, route: RouteRequest, sampling: common_pb2.SamplingParams, stream_interval: int = 0) -> ActorCall:
        return ActorCall(self, route, sampling, stream_interval)

    def gauges(self) -> dict[str, float]:
        figures = {"actors": float(len(self.actors)), "actors_healthy": float(sum(a.healthy for a in self.actors)),
                   "in_flight": float(sum(a.in_flight for a in self.actors)), "actor_retries": float(self.retries)}
        for a in self.actors:
            name = a.endpoint.address
            figures[f"actor_in_flight/{name}"] = float(a.in_flight)
            figures[f"actor_healthy/{name}"] = float(a.healthy)
            figures[f"actor_calls/{name}"] = float(a.calls)
            figures[f"actor_failures/{name}"] = float(a.failures)
        figures.update(self.router.gauges())
        return figures


class ActorCall:
    """One generation: iterate ``chunks()``; ``abort()`` stops it (the stream then ends with ABORT). Fails over to
    another actor while no token has arrived; after the first token an actor failure raises UpstreamFailed.
    ``stream_interval``: tokens per chunk after the first (0: the actor's setting)."""

    def __init__(self, actors: ActorSet, route: RouteRequest, sampling: common_pb2.SamplingParams,
                 stream_interval: int = 0) -> None:
        self.actors = actors
        self.route = route
        self.sampling = sampling
        self.stream_interval = stream_interval
        self.actor: ActorState | None = None
        self.request_id = ""
        self.aborted = False
        self.attempts = 0

    async def chunks(self) -> AsyncIterator[actor_pb2.GenerateChunk]:
        tried: set[str] = set()
        last_error = ""
        while True:
            try:
                endpoint = self.actors.router.choose(self.route, tried)
            except NoActorAvailable as exc:
                raise Unavailable(f"no actor could take the call: {last_error or exc}", code="no_actor") from exc
            tried.add(endpoint.address)
            actor = self.actors.by_address[endpoint.address]
            self.actor, self.request_id = actor, uuid.uuid4().hex
            self.attempts += 1
            if self.attempts > 1:
                self.actors.retries += 1
            actor.in_flight += 1
            actor.calls += 1
            request = actor_pb2.GenerateRequest(request_id=self.request_id, prompt_ids=self.route.prompt_ids,
                                                sampling=self.sampling, session_id=self.route.session_id,
                                                stream_interval=self.stream_interval)
            stream = actor.stub.Generate(request, metadata=self.actors.metadata)
            started = False
            sent = time.monotonic()
            router = self.actors.router
            try:
                async for chunk in stream:
                    if not started and chunk.token_ids:
                        router.on_first_token(self.route, endpoint.address, time.monotonic() - sent)
                    if chunk.finish_reason in (ERROR, ABORT) and not self.aborted:
                        what = chunk.error or ("the actor aborted the call" if chunk.finish_reason == ABORT
                                               else "the actor failed")
                        if started or chunk.token_ids:
                            raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: {what}")
                        raise _Retry(what)
                    started = started or bool(chunk.token_ids)
                    yield chunk
                    if chunk.finish_reason:
                        return
                raise _Retry("the actor closed the stream without finishing")
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or exc.code().name
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise BadRequest(f"the actor refused the request: {details}") from exc
                actor.failures += 1
                if code == grpc.StatusCode.UNAVAILABLE:
                    actor.healthy = False
                if started:
                    raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: {code.name}: "
                                         f"{details}") from exc
                last_error = f"{endpoint.address}: {code.name}: {details}"
                log.warning("actor %s failed before the first token (%s); trying another", endpoint.address,
                            code.name)
            except _Retry as exc:
                actor.failures += 1
                if started:
                    raise UpstreamFailed(f"actor {endpoint.address} failed mid-stream: {exc}") from exc
                last_error = f"{endpoint.address}: {exc}"
                log.warning("actor %s failed before the first token (%s); trying another", endpoint.address, exc)
            except UpstreamFailed:
                actor.failures += 1
                raise
            finally:
                actor.in_flight -= 1
                router.on_done(self.route, endpoint.address)
                if not stream.done():
                    stream.cancel()

    async def abort(self) -> None:
        """Ask the actor to stop; the remaining chunks (ending with ABORT) still arrive."""
        if self.aborted or self.actor is None:
            return
        self.aborted = True
        try:
            await self.actor.stub.Abort(actor_pb2.AbortRequest(request_id=self.request_id),
                                        metadata=self.actors.metadata, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            log.warning("abort of %s on %s failed: %s", self.request_id, self.actor.endpoint.address, exc.code().name)
