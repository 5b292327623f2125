"""Actors that come and go (``forge-gateway --actors-dir``): the ready-file directory is read again only where it
changed; every built-in router (and one's own) stays correct as actors are added and removed; the actor set adds
announced actors by their role, drains those whose ready file is removed and drops those unhealthy for too long; and
``forge top`` follows an actors directory as the gateway does. (Real gateways and actors through all of it:
integration/test_gateway_discovery.py.)

Nothing here depends on the machine's speed: events are waited for with generous bounds, never timed."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter

import grpc
import pytest

from forge.gateway.actors import ActorSet
from forge.gateway.config import GatewayConfig
from forge.gateway.discovery import ReadyDir, parse_ready_file
from forge.gateway.prefill import PrefillPool
from forge.gateway.routing import (
    ROUTER_NAMES,
    ActorEndpoint,
    KVRouter,
    NoActorAvailable,
    Router,
    RouteRequest,
    SessionAffinityRouter,
    make_router,
)
from forge.rpc import ServiceBinding, serve
from forge.settings import SettingsError
from forge.v1 import router_pb2, router_pb2_grpc

from helpers.gateway_announced_actor import announce, serve_announced_actor
from helpers.router_views import View, fleet
from helpers.waiting import wait_for_async

ROUTERS = [*ROUTER_NAMES, "helpers.custom_router:LastHealthyRouter"]


# ---------------------------------------------------------------------------------------------- the ready files


def test_the_ready_dir_reads_new_and_rewritten_files_and_ignores_the_rest(tmp_path, caplog):
    directory = tmp_path / "actors"
    directory.mkdir()
    ready = ReadyDir(directory)
    assert ready.scan() == {}
    first = announce(directory, "a", "127.0.0.1:5001")
    (directory / "b.json.tmp").write_text("{half")                  # a writer's temporary file
    (directory / ".c.json").write_text("{}")                        # hidden
    (directory / "gateway.json").write_text(json.dumps({"grpc_address": "127.0.0.1:1"}))   # no actor
    (directory / "broken.json").write_text("{not json")
    (directory / "sub").mkdir()
    announce(directory / "sub", "deeper", "127.0.0.1:5002")          # subdirectories are not looked into
    found = ready.scan()
    assert list(found) == ["a"] and found["a"].address == "127.0.0.1:5001" and found["a"].pid == os.getpid()
    assert found["a"].instance == "a" and found["a"].path == first
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("gateway.json names no actor" in w for w in warnings) and any("broken.json" in w for w in warnings)

    caplog.clear()
    assert ready.scan() == found                                   # unchanged: not read again, nor warned about
    assert not caplog.records
    announce(directory, "a", "127.0.0.1:5003")                      # rewritten: a restart on another port
    again = ready.scan()
    assert again["a"].address == "127.0.0.1:5003" and again["a"].stamp != found["a"].stamp
    (directory / "broken.json").write_text(json.dumps({"address": "127.0.0.1:5004"}))     # fixed
    assert set(ready.scan()) == {"a", "broken"}
    first.unlink()
    assert set(ready.scan()) == {"broken"}
    directory.rename(tmp_path / "moved")
    with pytest.raises(OSError):                                   # the caller keeps what it knew
        ready.scan()


@pytest.mark.parametrize(("text", "reason"), [
    ("[1]", "not a JSON object"), ("{}", 'no "address"'), ('{"address": "nowhere"}', "is not HOST:PORT"),
    ("{", "not JSON"),
])
def test_a_file_that_names_no_actor_says_why(tmp_path, text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_ready_file(tmp_path / "x.json", text)


def test_the_settings_take_an_actors_dir_instead_of_actors(tmp_path):
    config = GatewayConfig(actors_dir=tmp_path, pool_path="p", discovery_interval_s=0.1, drop_after_s=1.0)
    assert config.actors == () and config.actors_dir == tmp_path
    with pytest.raises(SettingsError, match="--actors-dir"):
        GatewayConfig(pool_path="p")


# ---------------------------------------------------------------------------------------------- routers


def fresh(n: int) -> RouteRequest:
    return RouteRequest(f"fresh-{n}", [n % 7 + 1] * 40)


def chosen(router: Router, requests: int, start: int = 0, done: bool = True) -> Counter[str]:
    """Where ``requests`` new sessions' calls go."""
    counts: Counter[str] = Counter()
    for n in range(start, start + requests):
        request = fresh(n)
        address = router.choose(request, set()).address
        counts[address] += 1
        router.on_first_token(request, address, 0.01)
        if done:
            router.on_done(request, address)
    return counts


def add(router: Router, views: list[View], address: str) -> View:
    view = View(ActorEndpoint(address))
    views.append(view)
    router.on_actor_added(view)
    return view


def remove(router: Router, views: list[View], address: str) -> None:
    views[:] = [v for v in views if v.endpoint.address != address]
    router.on_actor_removed(address)


@pytest.mark.parametrize("affinity", [True, False])
@pytest.mark.parametrize("name", ROUTERS)
def test_every_router_follows_actors_that_come_and_go(name, affinity):
    views = fleet(2)
    router = make_router(name, views, affinity)
    asyncio.run(router.start())                 # without channels: the KV routers poll nothing
    session = RouteRequest("pinned", [1, 2, 3] * 20)
    home = router.choose(session, set()).address
    router.on_done(session, home)
    assert set(chosen(router, 8)) <= {"a0:1", "a1:1"}

    add(router, views, "a2:1")                  # joins: it takes calls
    joined = fresh(100)                         # the router knows a call by its request: the same one ends it
    assert router.choose(joined, {"a0:1", "a1:1"}).address == "a2:1"
    router.on_done(joined, "a2:1")
    if name != "helpers.custom_router:LastHealthyRouter":     # that one always picks the last actor
        assert "a2:1" in chosen(router, 12, start=200)

    in_flight = RouteRequest("in-flight", [9] * 30)
    on = router.choose(in_flight, set()).address
    remove(router, views, on)                   # the call in flight there ends after its actor left
    router.on_first_token(in_flight, on, 0.02)
    router.on_done(in_flight, on)
    left = {v.endpoint.address for v in views}
    assert on not in left and set(chosen(router, 12, start=300)) <= left
    assert not [g for g in router.gauges() if g.endswith(f"/{on}")]

    remove(router, views, home if home in left else next(iter(left)))
    survivor = views[0].endpoint.address
    moved = router.choose(RouteRequest("pinned", [1, 2, 3] * 21), set()).address
    assert moved == survivor                    # a session whose actor left moves to one that is there
    remove(router, views, survivor)
    with pytest.raises(NoActorAvailable):       # none left
        router.choose(fresh(400), set())
    add(router, views, home)                    # the same address again (another process)
    assert router.choose(RouteRequest("pinned", [1, 2, 3] * 22), set()).address == home
    asyncio.run(router.close())


def test_the_affinity_wrapper_moves_sessions_and_passes_the_hooks_on():
    views = fleet(2)
    router = make_router("helpers.custom_router:LastHealthyRouter", views, True)
    assert isinstance(router, SessionAffinityRouter)
    seen: list[tuple[str, str]] = []
    router.inner.on_actor_added = lambda view: seen.append(("added", view.endpoint.address))
    router.inner.on_actor_removed = lambda address: seen.append(("removed", address))
    assert router.choose(RouteRequest("s", [1]), set()).address == "a1:1"
    add(router, views, "a2:1")
    assert router.choose(RouteRequest("s", [1]), set()).address == "a1:1"      # kept on its actor
    remove(router, views, "a1:1")
    assert "s" not in router._home
    assert router.choose(RouteRequest("s", [1]), set()).address == "a2:1"
    assert seen == [("added", "a2:1"), ("removed", "a1:1")]


def kv_events(address: str, blocks: list[bytes]) -> router_pb2.KVEvents:
    answer = router_pb2.KVEvents(layout=router_pb2.KVCacheLayout(model_id="m", block_size=16, num_blocks=4096),
                                 snapshot=True, figures={"prefill_tokens_per_s": 10_000.0})
    answer.events.add(kind=router_pb2.KVEvent.KIND_STORED, block_hashes=blocks)
    return answer


@pytest.mark.parametrize("name", ["cost-aware", "cache-aware", "kv-overlap"])
def test_a_kv_router_forgets_a_removed_actor_and_starts_afresh_with_a_new_one(name):
    views = fleet(2)
    router = make_router(name, views, True)
    assert isinstance(router, KVRouter)
    prompt = [3] * 200
    request = RouteRequest("s", prompt, group_id="g")
    router.apply("a0:1", kv_events("a0:1", [b"x"]))
    address = router.choose(request, set()).address
    router.apply(address, kv_events(address, router.hashes_for(request, router.models[address])))
    assert router.cached_tokens(request) > 0 and router.homes["s"] == address == router.groups["g"]

    remove(router, views, address)
    assert address not in router.models and "s" not in router.homes and "g" not in router.groups
    assert not [k for k in router._started if k[1] == address] and "s" not in router._homed
    router.apply(address, kv_events(address, [b"late"]))          # a late poll answer of the removed actor
    assert address not in router.models
    add(router, views, address)                 # back, as another process: nothing cached there yet
    assert len(router.models[address].blocks) == 0
    assert router.cached_tokens(RouteRequest("t", prompt)) == 0


def test_a_kv_router_polls_actors_that_join_and_stops_polling_those_that_leave():
    calls: list[str] = []

    class Events(router_pb2_grpc.KVEventSourceServicer):
        def __init__(self, name: str) -> None:
            self.name = name

        def PollKVEvents(self, request, context):
            calls.append(self.name)
            return kv_events(self.name, [self.name.encode()])

    servers = {n: serve([ServiceBinding.of(router_pb2_grpc.add_KVEventSourceServicer_to_server, Events(n),
                                           router_pb2, "KVEventSource")]) for n in ("first", "second")}

    async def scenario() -> None:
        views = []
        for server in servers.values():
            view = View(ActorEndpoint(server.address))
            view.channel = grpc.aio.insecure_channel(server.address)
            views.append(view)
        joining = views.pop()
        router = make_router("cost-aware", views, True)
        assert isinstance(router, KVRouter)
        router.poll_interval_s = 0.01
        await router.start()
        try:
            await wait_for_async(lambda: "first" in calls, "the first actor is polled")
            assert "second" not in calls
            views.append(joining)
            router.on_actor_added(joining)
            await wait_for_async(lambda: len(router.models[joining.endpoint.address].blocks) == 1,
                                   "the actor that joined is polled")
            leaving = views.pop(0)
            router.on_actor_removed(leaving.endpoint.address)
            rounds = calls.count("second")       # two rounds later, the round under way at the removal is over
            await wait_for_async(lambda: calls.count("second") >= rounds + 2, "two more rounds of polling")
            polled = calls.count("first")
            await wait_for_async(lambda: calls.count("second") >= rounds + 12, "ten more rounds of polling")
            assert calls.count("first") == polled and leaving.endpoint.address not in router.models
        finally:
            await router.close()
            for view in [*views, leaving]:
                await view.channel.close()

    try:
        asyncio.run(scenario())
    finally:
        for server in servers.values():
            server.stop(0)


def test_the_prefill_pool_takes_actors_in_and_out():
    pool = PrefillPool([View(ActorEndpoint("p0:1"))])
    pool.add(View(ActorEndpoint("p1:1")))
    pool.started("s", "p1:1", 100)
    assert pool.choose("s", 100, set()).endpoint.address == "p1:1"
    pool.remove("p1:1")
    pool.finished("p1:1", 100)                  # its prefill ends after it left
    assert pool.choose("s", 100, set()).endpoint.address == "p0:1" and "s" not in pool.homes
    assert "prefill_queued_tokens/p1:1" not in pool.gauges()


# ---------------------------------------------------------------------------------------------- the actor set


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_actor_set_adds_drains_drops_and_adds_again(tmp_path):
    """In one process, the clock in the test's hands: joins by role, a file that names no actor, a drain that waits
    for the call in flight, a drop after failed health checks, and a rewritten file that brings the actor back."""
    decode, _ = serve_announced_actor("both", name="decode")
    prefill, _ = serve_announced_actor("prefill", name="prefill")
    other, _ = serve_announced_actor("both", name="other")
    plain = serve([])                           # answers health, but it is no actor
    clock = Clock()

    async def scenario() -> None:
        actors = ActorSet([], "round-robin", False, health_interval_s=3600, actors_dir=tmp_path,
                          discovery_interval_s=3600, drop_after_s=5.0, clock=clock)
        assert "none is announced" in actors.no_actors()
        await actors.start()
        try:
            announce(tmp_path, "decode", decode.address)
            announce(tmp_path, "prefill", prefill.address)
            announce(tmp_path, "plain", plain.address)
            await actors.discover()
            announce(tmp_path, "twin", decode.address)          # the same actor twice: used once
            await actors.discover()
            assert [a.endpoint.address for a in actors.actors] == [decode.address]
            assert [a.endpoint.address for a in actors.prefill.actors] == [prefill.address]
            assert set(actors.waiting) == {"plain", "twin"} and actors.counters["actors_joined"] == 2
            assert actors.router.choose(RouteRequest("", [1]), set()).address == decode.address

            announce(tmp_path, "other", other.address)
            await actors.discover()
            assert [a.endpoint.address for a in actors.actors] == [decode.address, other.address]

            member = actors.by_address[decode.address]
            member.in_flight = 1                                 # a call in flight there
            (tmp_path / "decode.json").unlink()
            await actors.discover()
            assert actors.draining == [member] and member not in actors.actors
            assert member.channel is not None                    # its call still runs
            twin = actors.by_address[decode.address]             # and the twin file's actor takes over
            assert twin is not member and twin.source.name == "twin" and "twin" not in actors.waiting
            assert actors.actors == [actors.by_address[other.address], twin]
            member.in_flight = 0
            await wait_for_async(lambda: not actors.draining, "the drained actor is closed")
            assert member.channel is None and actors.counters["actors_drained"] == 1

            other.stop(0)                                        # gone, its ready file left behind
            for _ in range(3):
                await actors.check_health()
                clock.now += 3
            gone = [a for a in actors.every if a.endpoint.address == other.address]
            assert not gone and actors.counters["actors_dropped"] == 1 and "other" in actors.waiting
            assert actors.gauges()["actors"] == 1.0 and f"actor_calls/{other.address}" not in actors.gauges()
            await actors.discover()                              # its file is unchanged: it stays out
            assert other.address not in actors.by_address

            announce(tmp_path, "other", again.address)           # restarted elsewhere, its file rewritten
            await actors.discover()
            assert again.address in actors.by_address and actors.counters["actors_joined"] == 5
            gauges = actors.gauges()
            assert gauges["actors"] == 2.0 and gauges["actors_announced"] == 4.0
        finally:
            await actors.close()

    again, _ = serve_announced_actor("both", name="other again")
    try:
        asyncio.run(scenario())
    finally:
        for server in (decode, prefill, other, plain, again):
            server.stop(0)


def test_forge_top_follows_the_actors_of_an_actors_dir(tmp_path):
    """``forge top`` reads the actors directory like the gateway: a removed ready file is a service gone; and it
    shows a gateway's actors coming and going once some have."""
    from forge.app.top.discovery import discover
    from forge.app.top.view import actor_churn

    column = actor_churn()
    assert not column.shown({"actors": 2.0, "actors_joined": 0.0, "actors_drained": 0.0, "actors_dropped": 0.0})
    gauges = {"actors_joined": 3.0, "actors_drained": 1.0, "actors_dropped": 1.0, "actors_draining": 1.0}
    assert column.shown(gauges) and column.cell(None, gauges) == "+3 -2 (1 draining)"

    announce(tmp_path, "a", "127.0.0.1:5001")
    announce(tmp_path, "b", "127.0.0.1:5002")
    assert {t.address for t in discover(tmp_path)} == {"127.0.0.1:5001", "127.0.0.1:5002"}
    (tmp_path / "b.json").unlink()
    assert {t.address for t in discover(tmp_path)} == {"127.0.0.1:5001"}
