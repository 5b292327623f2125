"""The actors behind the gateway: one asyncio gRPC channel each, health checks, in-flight counts, the router that
picks among them and the prefill pool (disaggregated serving); their calls are ``forge.gateway.actor_calls``.

Actors come and go with ``--actors-dir`` (``forge.gateway.discovery``): an actor whose ready file appears there
joins (its role, from its Stats labels, says which set: the prefill pool or the decode actors the router sees); one
whose ready file is removed is drained (no new calls; those in flight finish, then its channel is closed); one whose
health checks fail for ``drop_after_s`` is dropped (a killed actor leaves its ready file behind) and added again
once its ready file is rewritten (a restart) or it answers again. Actors given on the command line never leave."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from forge.gateway.discovery import Announcement, ReadyDir
from forge.gateway.prefill import PrefillPool
from forge.gateway.routing import ActorEndpoint, Router, make_router
from forge.rpc.auth import bearer_metadata
from forge.v1 import actor_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.keepalive_time_ms", 30_000),
                   ("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 5_000)]
PROBE_TIMEOUT_S = 5.0            # an announced actor's Stats (its role) must come within this
DROP_MIN_CHECKS = 2              # an actor is dropped after at least this many failed health checks in a row
DRAIN_POLL_S = 0.05              # how often a draining actor's calls in flight are counted


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
    role: str = "both"                          # its Stats label: both, decode or prefill
    source: Announcement | None = None          # the ready file that announced it; None: given on the command line
    failed_checks: int = 0                      # failed health checks in a row
    unhealthy_since: float | None = None        # the first of them
    answers_whole: bool = True                  # it serves GenerateWhole (an older actor does not)


@dataclass
class _Waiting:
    """An announced actor that is not in use: not answering yet, dropped, or refused (``retry_at`` infinite: until
    its file changes)."""

    announcement: Announcement
    retry_at: float = 0.0
    tries: int = 0
    dropped: bool = False
    logged: set[str] = field(default_factory=set)


def cancelled_here() -> bool:
    """Whether the CancelledError being handled cancels this task; if not, an RPC of it was cancelled because its
    actor's channel was closed under it (the actor was dropped)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class ActorSet:
    """The actors: ``actors`` (decode or both: the list the router sees, changed in place as actors come and go),
    the prefill pool, and ``draining`` (removed from both, their calls in flight finishing)."""

    def __init__(self, addresses: Sequence[str], router: str = "least-loaded", session_affinity: bool = True,
                 api_key: str | None = None, health_interval_s: float = 2.0, prefill_addresses: Sequence[str] = (),
                 prefill_min_tokens: int = 64, actors_dir: Path | None = None, discovery_interval_s: float = 2.0,
                 drop_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic, adapter: str = "") -> None:
        """``adapter``: the actors' named adapter every call is sampled with (several runs on one fleet)."""
        if not addresses and actors_dir is None:
            raise ValueError("no actors: give at least one --actor host:port, or --actors-dir DIR")
        self.actors = [ActorState(ActorEndpoint(a)) for a in dict.fromkeys(addresses)]
        prefill = [ActorState(ActorEndpoint(a), role="prefill") for a in dict.fromkeys(prefill_addresses)]
        self.prefill = PrefillPool(prefill, prefill_min_tokens)
        self.draining: list[ActorState] = []
        self.by_address = {a.endpoint.address: a for a in self.every}
        self.router: Router = make_router(router, self.actors, session_affinity)
        self.router_name = router
        self.metadata = bearer_metadata(api_key)
        self.adapter = adapter
        self.health_interval_s = health_interval_s
        self.actors_dir = actors_dir
        self.ready_dir = ReadyDir(actors_dir) if actors_dir is not None else None
        self.discovery_interval_s = discovery_interval_s
        self.drop_after_s = drop_after_s
        self.clock = clock
        self.announced: dict[str, Announcement] = {}    # the ready files of actors_dir at the last scan, by name
        self.waiting: dict[str, _Waiting] = {}          # those of them whose actor is not in use, by name
        self.retries = 0
        self.counters = {"actors_joined": 0, "actors_drained": 0, "actors_dropped": 0}
        self._health_task: asyncio.Task | None = None
        self._discovery_task: asyncio.Task | None = None
        self._drains: set[asyncio.Task] = set()         # waiting for a draining actor's calls to finish
        self._closing: set[asyncio.Task] = set()        # closing a dropped actor's channel
        self._scan_failed = False

    @property
    def every(self) -> list[ActorState]:
        """The actors in use: decode (or both) and prefill."""
        return [*self.actors, *self.prefill.actors]

    async def start(self) -> None:
        for actor in self.every:
            self._open(actor)
        await self._check_roles()
        self._health_task = asyncio.create_task(self._watch_health(), name="actor-health")
        await self.router.start(self.metadata)
        if self.ready_dir is not None:
            await asyncio.to_thread(self.ready_dir.directory.mkdir, parents=True, exist_ok=True)
            await self.discover()           # the actors announced already serve from the first call
            self._discovery_task = asyncio.create_task(self._discover_forever(), name="actor-discovery")

    @staticmethod
    def _open(actor: ActorState) -> None:
        actor.channel = grpc.aio.insecure_channel(actor.endpoint.address, options=CHANNEL_OPTIONS)
        actor.stub = actor_pb2_grpc.ActorStub(actor.channel)
        actor.health = health_pb2_grpc.HealthStub(actor.channel)

    async def _check_roles(self) -> None:
        """Refuse to start with an actor whose role (Stats label) does not fit where it was given; an actor not
        reachable yet is checked by its calls instead."""
        if not self.prefill.actors:
            return
        prefill = {a.endpoint.address for a in self.prefill.actors}
        for actor in self.every:
            try:
                report = await actor.stub.Stats(common_pb2.StatsRequest(), metadata=self.metadata, timeout=5.0)
            except grpc.aio.AioRpcError:
                continue
            role = report.labels.get("role", "both")
            address = actor.endpoint.address
            if address in prefill and role != "prefill":
                raise ValueError(f"--prefill-actor {address} is a {role} actor; start it with --role prefill")
            if address not in prefill and role == "prefill":
                raise ValueError(f"--actor {address} is a prefill actor; give it as --prefill-actor")

    async def close(self) -> None:
        for task in [self._health_task, self._discovery_task, *self._drains]:
            if task is not None:
                task.cancel()
        await self.router.close()
        for actor in [*self.every, *self.draining]:
            await self._close_channel(actor)
        await asyncio.gather(*self._closing, return_exceptions=True)

    @staticmethod
    async def _close_channel(actor: ActorState) -> None:
        channel, actor.channel = actor.channel, None
        if channel is not None:
            await channel.close(grace=None)

    @staticmethod
    def _spawn(tasks: set[asyncio.Task], coroutine: Coroutine[None, None, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _check(self, actor: ActorState) -> None:
        if actor.health is None or actor.channel is None:
            return
        try:
            response = await actor.health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            healthy = response.status == health_pb2.HealthCheckResponse.SERVING
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            healthy = False
        except asyncio.CancelledError:
            if cancelled_here():
                raise
            healthy = False
        if actor.channel is None:               # closed while the check ran
            return
        if healthy != actor.healthy:
            log.log(logging.INFO if healthy else logging.WARNING, "actor %s is %s", actor.endpoint.address,
                    "healthy again" if healthy else "unhealthy")
        actor.healthy = healthy
        if healthy:
            actor.failed_checks, actor.unhealthy_since = 0, None
        else:
            actor.failed_checks += 1
            if actor.unhealthy_since is None:
                actor.unhealthy_since = self.clock()

    async def check_health(self) -> None:
        """One round of health checks of every actor, then drop the announced ones unhealthy for too long."""
        await asyncio.gather(*(self._check(a) for a in [*self.every, *self.draining]))
        self._drop_unhealthy()

    async def _watch_health(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.health_interval_s)

    # ------------------------------------------------------------------ actors that come and go

    def no_actors(self) -> str:
        """Why no actor can take a call when there is none at all."""
        if self.actors_dir is None:
            return "there are no actors"
        return (f"there are no actors: none is announced in --actors-dir {self.actors_dir} and answering "
                f"({len(self.announced)} ready files, {len(self.waiting)} of them not in use)")

    async def _discover_forever(self) -> None:
        # polled: inotify does not see files written on other hosts of NFS or a distributed file system
        while True:
            await asyncio.sleep(self.discovery_interval_s)
            try:
                await self.discover()
            except Exception:                   # the loop must go on: log it, look again next time
                log.exception("looking for actors in %s failed", self.actors_dir)

    async def discover(self) -> None:
        """One look at the actors directory: drain the actors whose ready file is gone (or now names another
        process), and add those announced and answering."""
        assert self.ready_dir is not None
        try:
            found = await asyncio.to_thread(self.ready_dir.scan)
        except OSError as exc:                  # nothing known: every actor stays as it is
            if not self._scan_failed:
                log.warning("cannot list %s (%s); actors stay as they are until it can be read", self.actors_dir,
                            exc)
            self._scan_failed = True
            return
        if self._scan_failed:
            log.info("%s can be read again", self.actors_dir)
            self._scan_failed = False
        now = self.clock()
        for name in [n for n in self.announced if n not in found]:
            del self.announced[name]
            self.waiting.pop(name, None)
            member = self._member_of(name)
            if member is not None:
                self._drain(member, f"its ready file {name}.json was removed")
        for name, announcement in found.items():
            previous = self.announced.get(name)
            self.announced[name] = announcement
            if previous is not None and previous.stamp == announcement.stamp:
                continue
            member = self._member_of(name)
            if member is not None:
                if previous is not None and (previous.address, previous.pid) == (announcement.address,
                                                                                announcement.pid):
                    member.source = announcement    # written again by the same actor
                    continue
                self._drain(member, f"{name}.json now announces {announcement.address} (pid {announcement.pid})")
            self.waiting[name] = _Waiting(announcement, retry_at=now)   # new, or rewritten: a restart
        due = [w for w in self.waiting.values() if w.retry_at <= now]
        await asyncio.gather(*(self._admit(w) for w in due))

    def _member_of(self, name: str) -> ActorState | None:
        return next((a for a in self.every if a.source is not None and a.source.name == name), None)

    def _note(self, waiting: _Waiting, key: str, level: int, message: str, *args: object) -> None:
        """Log ``message`` once per ``key`` for this announcement."""
        if key not in waiting.logged:
            waiting.logged.add(key)
            log.log(level, message, *args)

    async def _admit(self, waiting: _Waiting) -> None:
        """Add the actor ``waiting`` announces if it answers its Stats (its role says where it goes)."""
        announcement = waiting.announcement
        address, name = announcement.address, announcement.name
        waiting.tries += 1
        if address in self.by_address:          # given on the command line, or announced by another file
            self._note(waiting, "duplicate", logging.WARNING, "%s announces %s, which is in use already; ignored "
                       "while it is", announcement.path, address)
            waiting.retry_at = self.clock()    # looked at again at every scan
            return
        actor = ActorState(ActorEndpoint(address), source=announcement)
        self._open(actor)
        try:
            report = await actor.stub.Stats(common_pb2.StatsRequest(), metadata=self.metadata,
                                            timeout=PROBE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            await self._close_channel(actor)
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._note(waiting, "not-an-actor", logging.WARNING, "%s announces %s, which is not an actor (it "
                           "serves no forge.v1.Actor); ignored until the file changes", announcement.path, address)
                waiting.retry_at = math.inf
                return
            # soon while it may still be starting, then at most every drop_after_s; a dropped one every drop_after_s
            backoff = self.drop_after_s if waiting.dropped else min(
                self.drop_after_s, self.discovery_interval_s * 2 ** min(waiting.tries, 16))
            waiting.retry_at = self.clock() + max(backoff, self.discovery_interval_s)
            if not waiting.dropped:
                self._note(waiting, "no-answer", logging.WARNING, "actor %s announced in %s does not answer "
                           "(%s); trying again", address, announcement.describe(), exc.code().name)
            return
        if self.waiting.get(name) is not waiting or address in self.by_address:
            await self._close_channel(actor)    # its file changed or went while it was asked, or it is taken
            return
        del self.waiting[name]
        actor.role = report.labels.get("role", "both")
        self.by_address[address] = actor
        if actor.role == "prefill":
            self.prefill.add(actor)
        else:
            self.actors.append(actor)
            self.router.on_actor_added(actor)
        self.counters["actors_joined"] += 1
        log.info("actor %s %s as a %s actor (%s)", address, "is back" if waiting.dropped else "joined",
                 actor.role, announcement.describe())

    def _remove(self, actor: ActorState) -> None:
        """Take ``actor`` out of the set it is in; it gets no new call."""
        address = actor.endpoint.address
        if self.by_address.get(address) is actor:
            del self.by_address[address]
        if actor in self.prefill.actors:
            self.prefill.remove(address)
        elif actor in self.actors:
            self.actors.remove(actor)
            self.router.on_actor_removed(address)

    def _drain(self, actor: ActorState, why: str) -> None:
        self._remove(actor)
        self.draining.append(actor)
        log.info("actor %s is leaving (%s): no new calls; %d in flight finish first", actor.endpoint.address, why,
                 actor.in_flight)
        self._spawn(self._drains, self._finish_drain(actor), f"drain-{actor.endpoint.address}")

    async def _finish_drain(self, actor: ActorState) -> None:
        while actor.in_flight > 0 and actor in self.draining:
            await asyncio.sleep(DRAIN_POLL_S)
        if actor not in self.draining:          # dropped meanwhile
            return
        self.draining.remove(actor)
        await self._close_channel(actor)
        self.counters["actors_drained"] += 1
        log.info("actor %s drained and removed", actor.endpoint.address)

    def _drop_unhealthy(self) -> None:
        now = self.clock()
        for actor in [*self.every, *self.draining]:
            since = actor.unhealthy_since
            if (actor.source is None or actor.healthy or since is None or actor.failed_checks < DROP_MIN_CHECKS
                    or now - since < self.drop_after_s):
                continue
            announcement = actor.source
            if actor in self.draining:
                self.draining.remove(actor)
            else:
                self._remove(actor)
            channel, actor.channel = actor.channel, None     # at once: nothing more is sent on it
            if channel is not None:
                self._spawn(self._closing, channel.close(grace=None), f"close-{actor.endpoint.address}")
            self.counters["actors_dropped"] += 1
            still = self.announced.get(announcement.name) == announcement
            log.warning("actor %s dropped: unhealthy for %.1f s (%d failed health checks, %d calls in flight "
                        "fail)%s", actor.endpoint.address, now - since, actor.failed_checks, actor.in_flight,
                        f"; it is added again when {announcement.path.name} is rewritten or it answers again"
                        if still else "")
            if still and announcement.name not in self.waiting:
                self.waiting[announcement.name] = _Waiting(announcement, retry_at=now + self.drop_after_s,
                                                           dropped=True)

    def gauges(self) -> dict[str, float]:
        figures = {"actors": float(len(self.actors)), "actors_healthy": float(sum(a.healthy for a in self.actors)),
                   "in_flight": float(sum(a.in_flight for a in [*self.actors, *self.draining])),
                   "actor_retries": float(self.retries), "actors_draining": float(len(self.draining)),
                   "actors_announced": float(len(self.announced))}
        figures.update({k: float(v) for k, v in self.counters.items()})
        for a in [*self.draining, *self.every]:         # an address in both: the actor in use
            name = a.endpoint.address
            figures[f"actor_in_flight/{name}"] = float(a.in_flight)
            figures[f"actor_healthy/{name}"] = float(a.healthy)
            figures[f"actor_calls/{name}"] = float(a.calls)
            figures[f"actor_failures/{name}"] = float(a.failures)
        figures.update(self.router.gauges())
        if self.prefill.actors:
            figures["prefill_actors"] = float(len(self.prefill.actors))
            figures.update(self.prefill.gauges())
        return figures
