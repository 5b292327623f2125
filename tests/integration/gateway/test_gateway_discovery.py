"""Real gateways with actors that come and go (``forge-gateway --actors-dir``): an actor joins, a second joins, one
is drained with a call in flight, one killed with SIGKILL is dropped and, restarted on another port, is added again.

Nothing here depends on the machine's speed: events are waited for with generous bounds, never timed."""

from __future__ import annotations

import os
import shutil
import threading

import httpx

from helpers.gateway_announced_actor import announce, serve_announced_actor
from helpers.gateway_fake_actor import serve_fake_actor
from helpers.gateway_procs import start_actor, start_gateway
from helpers.waiting import WAIT_S, wait_for


def gauges_of(gateway) -> dict[str, float]:
    return httpx.get(f"{gateway.http}/v1/stats", timeout=30).json()["gauges"]


def chat(gateway, content: str = "hi", **extra) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=120,
                      json={"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra})


def test_a_call_in_flight_on_a_drained_actor_finishes_and_new_calls_go_elsewhere(tmp_path):
    actors_dir = tmp_path / "actors"
    static, static_servicer = serve_fake_actor("script", [5, 6, 7])
    held, held_servicer = serve_announced_actor(hold=True, name="held")
    gateway = start_gateway(tmp_path, [static.address], tmp_path / "pool", "--actors-dir", str(actors_dir),
                            "--discovery-interval", "0.1", "--drop-after", "1", "--health-interval", "0.2",
                            "--router", "kv-overlap")     # a KV-aware router: by load here (no KV events)
    results: list[httpx.Response] = []
    try:
        ready = announce(actors_dir, "held", held.address)
        wait_for(lambda: gauges_of(gateway)["actors"] == 2, "the announced actor joins")
        threads = []
        for n in range(40):                      # the router spreads calls: until one waits on the held actor
            thread = threading.Thread(target=lambda n=n: results.append(chat(gateway, f"q{n}")))
            thread.start()
            threads.append(thread)
            wait_for(lambda t=thread: held_servicer.holding.is_set() or not t.is_alive(), "the call ends")
            if held_servicer.holding.is_set():
                break
        assert held_servicer.holding.is_set() and held_servicer.calls == 1

        ready.unlink()                           # leave: drained
        wait_for(lambda: (lambda g: g["actors"] == 1 and g["actors_draining"] == 1)(gauges_of(gateway)),
                   "the actor is draining")
        served_before = static_servicer.calls
        for n in range(4):
            assert chat(gateway, f"after {n}").status_code == 200
        assert static_servicer.calls == served_before + 4 and held_servicer.calls == 1
        assert gauges_of(gateway)[f"actor_in_flight/{held.address}"] == 1

        held_servicer.release.set()              # the call in flight finishes, whole
        for thread in threads:
            thread.join(WAIT_S)
        assert [r.status_code for r in results] == [200] * len(results)
        assert sum(r.json()["usage"]["completion_tokens"] == 2 for r in results) == 1
        final = wait_for(lambda: (lambda g: g if g["actors_drained"] == 1 else None)(gauges_of(gateway)),
                           "the drained actor is removed")
        assert f"actor_calls/{held.address}" not in final and final["actors_draining"] == 0
        assert final["actors"] == 1 and final["actors_joined"] == 1 and final["actors_dropped"] == 0

        announce(actors_dir, "held", held.address)   # and back
        wait_for(lambda: gauges_of(gateway)["actors_joined"] == 2, "the actor joins again")
    finally:
        held_servicer.release.set()
        gateway.stop()
        static.stop(0)
        held.stop(0)


def test_actors_join_are_dropped_when_killed_and_come_back_restarted(tmp_path):
    actors_dir = tmp_path / "actors"
    staging = tmp_path / "staging"
    gateway = start_gateway(tmp_path, [], tmp_path / "pool", "--actors-dir", str(actors_dir),
                            "--discovery-interval", "0.1", "--drop-after", "1", "--health-interval", "0.2",
                            "--router", "round-robin", "--no-session-affinity")
    started = []
    try:
        refused = chat(gateway)                  # no actor yet: a clear 503
        error = refused.json()["error"]
        assert refused.status_code == 503 and error["code"] == "no_actor", refused.text
        assert "none is announced in --actors-dir" in error["message"]

        first = start_actor(actors_dir, "first")             # writes actors/first.json once it serves
        started.append(first)
        wait_for(lambda: gauges_of(gateway)["actors"] == 1, "the first actor joins")
        assert chat(gateway).status_code == 200
        assert gauges_of(gateway)[f"actor_calls/{first.address}"] == 1

        second = start_actor(actors_dir, "second")
        started.append(second)
        wait_for(lambda: gauges_of(gateway)["actors"] == 2, "the second actor joins")
        for n in range(4):                       # round-robin: both serve
            assert chat(gateway, f"q{n}").status_code == 200
        gauges = gauges_of(gateway)
        assert gauges[f"actor_calls/{second.address}"] >= 1 and gauges[f"actor_calls/{first.address}"] >= 2

        second.kill()                            # kill -9: its ready file stays
        assert (actors_dir / "second.json").exists()
        failures = []

        def dropped() -> bool:
            response = chat(gateway, "meanwhile")   # calls keep succeeding, on the first actor
            if response.status_code != 200:
                failures.append(response.text)
            return gauges_of(gateway)["actors_dropped"] == 1

        wait_for(dropped, "the killed actor is dropped")
        assert not failures
        gauges = gauges_of(gateway)
        assert gauges["actors"] == 1 and f"actor_calls/{second.address}" not in gauges

        # restarted, on another port, with the same ready file, rewritten whole as forge-actor does
        restarted = start_actor(staging, "second")
        started.append(restarted)
        temporary = actors_dir / "second.json.tmp"
        shutil.copy(staging / "second.json", temporary)
        os.replace(temporary, actors_dir / "second.json")
        wait_for(lambda: gauges_of(gateway)["actors"] == 2, "the restarted actor is added again")
        for n in range(4):
            assert chat(gateway, f"again {n}").status_code == 200
        gauges = gauges_of(gateway)
        assert gauges[f"actor_calls/{restarted.address}"] >= 1 and gauges["actors_joined"] == 3

        first.stop()                             # a clean stop withdraws its ready file first: drained
        assert not (actors_dir / "first.json").exists()
        wait_for(lambda: gauges_of(gateway)["actors"] == 1, "the stopped actor leaves")
        assert chat(gateway, "after the stop").status_code == 200
    finally:
        gateway.stop()
        for actor in started:
            actor.stop()
