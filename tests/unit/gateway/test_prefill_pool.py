"""The disaggregated gateway's prefill pool: which calls it takes, and which prefill actor each goes to."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from forge.gateway.prefill import PrefillPool
from forge.gateway.routing.base import ActorEndpoint, NoActorAvailable


@dataclass
class Actor:
    endpoint: ActorEndpoint
    healthy: bool = True
    in_flight: int = 0


def pool_of(count: int, min_tokens: int = 64) -> tuple[PrefillPool, list[Actor]]:
    actors = [Actor(ActorEndpoint(f"127.0.0.1:{5000 + i}")) for i in range(count)]
    return PrefillPool(actors, min_tokens), actors


def test_a_call_is_prefilled_apart_when_enough_of_its_prompt_is_not_cached():
    pool, _ = pool_of(1, min_tokens=64)
    assert pool.wanted(64, None)                 # the router knows nothing: the whole prompt counts
    assert pool.wanted(500, 436)
    assert not pool.wanted(63, None)
    assert not pool.wanted(500, 437)
    assert pool.counters["prefill_skipped"] == 2


def test_the_least_queued_prefill_actor_wins_and_queues_drain_when_prefills_finish():
    pool, actors = pool_of(3)
    a, b, c = (actor.endpoint.address for actor in actors)
    pool.started("s1", a, 1000)
    pool.started("s2", b, 300)
    assert pool.choose("s3", 200, set()).endpoint.address == c
    pool.started("s3", c, 200)
    assert pool.choose("s4", 100, set()).endpoint.address == c
    pool.finished(a, 1000)
    assert pool.choose("s4", 100, set()).endpoint.address == a
    assert pool.gauges()[f"prefill_queued_tokens/{b}"] == 300 and pool.counters["prefills"] == 3


def test_a_session_stays_on_its_prefill_actor_while_it_is_at_most_a_prompt_busier():
    pool, actors = pool_of(2)
    home, other = (actor.endpoint.address for actor in actors)
    pool.started("agent", home, 400)
    pool.finished(home, 400)
    pool.started("noisy", home, 300)
    assert pool.choose("agent", 300, set()).endpoint.address == home       # 300 above the idle one: still home
    assert pool.choose("agent", 299, set()).endpoint.address == other      # more than its prompt above: moves
    assert pool.choose("stranger", 5000, set()).endpoint.address == other


def test_excluded_and_unhealthy_prefill_actors_are_passed_over():
    pool, actors = pool_of(2)
    first, second = (actor.endpoint.address for actor in actors)
    assert pool.choose("s", 100, {first}).endpoint.address == second
    actors[1].healthy = False
    assert pool.choose("s", 100, set()).endpoint.address == first
    actors[0].healthy = False                # none healthy: the untried ones are tried (they may have recovered)
    assert pool.choose("s", 100, {first}).endpoint.address == second
    with pytest.raises(NoActorAvailable):
        pool.choose("s", 100, {first, second})
