"""The KV-aware routers on synthetic actor states: each policy picks what it should, session affinity is a
preference that never overloads an actor, the rollouts of a group share their prompt's prefix, KV events and
weight versions move the router's picture of each actor's cache, and call timings feed back into its estimates."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.gateway.routing import (
    CacheAwareRouter,
    CostAwareRouter,
    KVOverlapRouter,
    KVRouter,
    LeastLoadedRouter,
    RouteRequest,
    make_router,
)
from forge.gateway.routing.fleet import Layout, Pending, PendingCalls, prompt_hashes
from forge.v1 import router_pb2

from helpers.router_views import View, fleet

STORED, EVICTED = router_pb2.KVEvent.KIND_STORED, router_pb2.KVEvent.KIND_EVICTED
LAYOUT = Layout("m", 3, "mtp", 16, 40_960, 4096, 64, False)


def layout_proto(layout: Layout) -> router_pb2.KVCacheLayout:
    return router_pb2.KVCacheLayout(model_id=layout.model_id, weight_version=layout.weight_version,
                                    variant=layout.variant, block_size=layout.block_size,
                                    block_bytes=layout.block_bytes, num_blocks=layout.num_blocks,
                                    max_running=layout.max_running, l3=layout.l3)


def report(router: KVRouter, address: str, stored=(), evicted=(), layout: Layout = LAYOUT, snapshot=False,
           tps: float = 10_000.0, **figures) -> None:
    answer = router_pb2.KVEvents(layout=layout_proto(layout), snapshot=snapshot,
                                 figures={"prefill_tokens_per_s": tps, **figures})
    if evicted:
        answer.events.add(kind=EVICTED, block_hashes=list(evicted))
    if stored:
        answer.events.add(kind=STORED, block_hashes=list(stored))
    router.apply(address, answer)


def prompt(seed: int, length: int = 800) -> list[int]:
    return [(seed * 7919 + i * 31) % 1000 for i in range(length)]


def ready(router: KVRouter, views: list[View], layout: Layout = LAYOUT) -> None:
    for view in views:
        report(router, view.endpoint.address, layout=layout, snapshot=True)


def test_cost_aware_goes_where_the_prefix_is_cached_unless_that_actor_is_queued():
    views = fleet()
    router = CostAwareRouter(views)
    ready(router, views)
    ids = prompt(1)
    report(router, "a1:1", prompt_hashes(ids, LAYOUT))
    assert router.choose(RouteRequest("s", [*ids, 5, 6]), set()).address == "a1:1"
    router.on_done(RouteRequest("s", ids), "a1:1")
    router.models["a1:1"].pending = PendingCalls({i: Pending(4000, 0.0, 0.0) for i in range(3)})   # 12k to prefill
    request = RouteRequest("t", [*ids, 7])
    chosen = router.choose(request, set()).address
    assert chosen != "a1:1"
    options = {o.address: o for o in (router.option(request, v, 0) for v in views)}
    assert options["a1:1"].local == len(prompt_hashes(request.prompt_ids, LAYOUT))
    assert options["a1:1"].compute_tokens <= 16
    assert options[chosen].estimate_s < options["a1:1"].estimate_s


def test_cost_aware_counts_blocks_it_would_fetch_from_l3():
    views = fleet(3)
    router = CostAwareRouter(views)
    with_l3 = replace(LAYOUT, l3=True)
    ids = prompt(2)
    report(router, "a0:1", layout=LAYOUT, snapshot=True)
    report(router, "a1:1", layout=with_l3, snapshot=True, l3_fetch_bytes_per_s=1e9, l3_lookup_s=1e-3)
    report(router, "a2:1", prompt_hashes(ids, with_l3), layout=with_l3, snapshot=True)   # published to L3 by a2
    views[2].healthy = False
    request = RouteRequest("s", ids)
    option = router.option(request, views[1], 0)
    assert option.local == 0 and option.fetch == len(prompt_hashes(ids, with_l3)) and option.compute_tokens <= 16
    assert router.choose(request, set()).address == "a1:1"
    slow = CostAwareRouter(views)                        # a fetch slower than recomputing is not counted
    report(slow, "a1:1", layout=with_l3, snapshot=True, l3_fetch_bytes_per_s=1e3)
    report(slow, "a2:1", prompt_hashes(ids, with_l3), layout=with_l3)
    assert slow.option(request, views[1], 0).fetch == 0


def test_session_affinity_is_a_preference_that_never_overloads():
    views = fleet(3)
    router = CostAwareRouter(views, prefer_slack=1e6)    # the home is preferred whatever its estimate...
    ready(router, views)
    first = router.choose(RouteRequest("s", prompt(3, 40)), set()).address
    router.on_done(RouteRequest("s", []), first)
    other = prompt(4, 900)
    for view in views:
        if view.endpoint.address != first:
            report(router, view.endpoint.address, prompt_hashes(other, LAYOUT))
    assert router.choose(RouteRequest("s", other), set()).address == first
    assert router.decisions["affinity"] == 1
    home = next(v for v in views if v.endpoint.address == first)
    home.in_flight = 9                                   # ...unless it is over its share cap
    assert router.choose(RouteRequest("s", other), set()).address != first
    assert not CostAwareRouter(views, session_affinity=False).homes


def test_group_rollouts_share_their_prompt_prefix_unless_the_actor_is_overloaded():
    views = fleet(4)
    router = CostAwareRouter(views)
    ready(router, views)
    ids = prompt(5, 600)
    chosen = set()
    for member in range(4):
        endpoint = router.choose(RouteRequest(f"g-{member}", ids, group_id="g"), set())
        chosen.add(endpoint.address)
        next(v for v in views if v.endpoint == endpoint).in_flight += 1
    assert len(chosen) == 1
    assert router.decisions["group"] == 3
    home = next(v for v in views if v.endpoint.address in chosen)
    home.in_flight = 9                                   # over its share cap: the group rule yields to the cost
    router.models[home.endpoint.address].pending[0] = Pending(20_000, 0.0, 0.0)
    assert router.choose(RouteRequest("g-late", ids, group_id="g"), set()).address not in chosen
    assert router.decisions["group"] == 3

    plain = CostAwareRouter(fleet(4))                    # without a group id the predicted prefix does the same
    ready(plain, plain.actors)
    assert len({plain.choose(RouteRequest(f"p-{i}", ids), set()).address for i in range(4)}) == 1


def test_cache_aware_uses_the_best_match_only_above_threshold_and_when_balanced():
    views = fleet(3)
    router = CacheAwareRouter(views, match_threshold=0.5, balance_abs=4, balance_rel=1.5)
    ready(router, views)
    ids = prompt(6)
    hashes = prompt_hashes(ids, LAYOUT)
    report(router, "a2:1", hashes)
    report(router, "a0:1", hashes[:10])
    views[2].in_flight = 3
    assert router.choose(RouteRequest("", ids), set()).address == "a2:1"        # match rate ~1 > 0.5
    assert router.decisions["prefix"] == 1
    other = prompt(7)
    report(router, "a0:1", prompt_hashes(other, LAYOUT)[:10])                  # 160 / 800 tokens: below threshold
    views[1].in_flight = 1
    assert router.choose(RouteRequest("", other), set()).address == "a0:1"     # least loaded (0 in flight)
    views[2].in_flight = 9                                                      # imbalanced: 9 vs 0 > 4 and 1.5x
    assert router.choose(RouteRequest("", ids), set()).address == "a0:1"
    assert router.decisions["balance"] == 2


def test_kv_overlap_weighs_blocks_to_compute_against_active_blocks():
    views = fleet(2)
    router = KVOverlapRouter(views, alpha=1.0)
    ready(router, views)
    ids = prompt(8)                                                              # 50 blocks to compute
    report(router, "a1:1", prompt_hashes(ids, LAYOUT)[:30])
    router.models["a1:1"].active_blocks = 35                                    # 20 + 35 > 50 + 0
    assert router.choose(RouteRequest("", ids), set()).address == "a0:1"
    router.models["a0:1"].active_blocks = 100
    router.models["a1:1"].active_blocks = 25
    assert router.choose(RouteRequest("", ids), set()).address == "a1:1"


def test_kv_events_and_a_new_weight_version_move_the_picture_of_each_cache():
    views = fleet(2)
    router = CostAwareRouter(views)
    ready(router, views)
    ids = prompt(9)
    hashes = prompt_hashes(ids, LAYOUT)
    report(router, "a0:1", hashes)
    request = RouteRequest("", ids)
    assert router.option(request, views[0], 0).local == len(hashes)
    report(router, "a0:1", evicted=hashes[20:21])
    assert router.option(request, views[0], 0).local == 20
    report(router, "a0:1", hashes[:5], snapshot=True)
    assert router.option(request, views[0], 0).local == 5
    newer = replace(LAYOUT, weight_version=4)
    report(router, "a0:1", layout=newer)                                         # new salt: nothing of v3 counts
    assert router.option(RouteRequest("", ids), views[0], 0).local == 0
    assert prompt_hashes(ids, newer)[0] != hashes[0]


def test_timings_feed_back_into_estimates_and_figures():
    views = fleet(2)
    clock = [0.0]
    router = CostAwareRouter(views, clock=lambda: clock[0])
    ready(router, views)
    request = RouteRequest("s", prompt(10, 400))
    address = router.choose(request, set()).address
    model = router.models[address]
    assert model.pending_tokens == 400 and model.active_blocks > 0
    estimate = model.pending[id(request)].estimate_s
    router.on_first_token(request, address, estimate * 3)
    assert not model.pending and model.calibration.value == pytest.approx(3.0)
    clock[0] = 2.0
    router.on_done(request, address)
    assert model.active_blocks == 0 and model.service_s.value == pytest.approx(2.0)
    gauges = router.gauges()
    assert gauges["router_decisions"] == 1 and gauges["router_ttft_observed"] == 1
    assert gauges["router_ttft_error_ms"] == pytest.approx(-2 * estimate * 1e3)
    assert gauges[f"router_calibration/{address}"] == pytest.approx(3.0)


def test_actors_without_kv_events_are_routed_by_load_and_names_resolve():
    views = fleet(3)
    router = make_router("cost-aware", views, session_affinity=True)
    assert isinstance(router, CostAwareRouter)
    views[0].in_flight, views[1].in_flight = 2, 1
    picks = [router.choose(RouteRequest("", [1, 2, 3]), set()).address for _ in range(3)]
    assert picks[0] == "a2:1" and len(set(picks)) >= 2                          # no layout: pending tokens balance
    assert router.choose(RouteRequest("", [1]), {"a0:1", "a1:1"}).address == "a2:1"
    assert isinstance(make_router("cache-aware", views, False), CacheAwareRouter)
    assert isinstance(make_router("kv-overlap", views, False), KVOverlapRouter)
    assert isinstance(make_router("least-loaded", views, False), LeastLoadedRouter)
    with pytest.raises(ValueError, match="cost-aware"):
        make_router("random", views, False)


def test_a_sessions_chains_are_extended_not_recomputed_and_equal_a_fresh_hash():
    views = fleet(1)
    router = CostAwareRouter(views)
    ready(router, views)
    ids = prompt(11, 500)
    turns = [ids, ids + prompt(12, 300), ids[:100] + prompt(13, 50), prompt(14, 33)]   # extend, rewrite, replace
    for turn in turns:
        request = RouteRequest("s", turn)
        assert router.hashes_for(request, router.models["a0:1"]) == prompt_hashes(turn, LAYOUT)
    router.forget("s")
    assert "s" not in router._chains


def test_new_sessions_spread_their_homes_and_long_sessions_avoid_congested_or_forgetful_actors():
    views = fleet(4)
    router = CostAwareRouter(views, home_cap=1.25, min_cap=2)
    ready(router, views)
    shared = prompt(15, 640)
    report(router, "a0:1", prompt_hashes(shared, LAYOUT))                 # everybody's system prompt is on a0
    homes = [router.choose(RouteRequest(f"s{i}", [*shared, i]), set()).address for i in range(20)]
    assert homes.count("a0:1") <= 1.25 * 20 / 4 + 1 and router.models["a0:1"].sessions == homes.count("a0:1")
    for i in range(20):
        router.on_done(RouteRequest(f"s{i}", []), homes[i])
        router.forget(f"s{i}")
    assert router.session_lengths[1] == 20 and router.models["a0:1"].sessions == 0

    fresh = CostAwareRouter(fleet(2))
    ready(fresh, fresh.actors)
    fresh.session_lengths.update({10: 5})                                   # sessions last 10 calls
    assert fresh.remaining_calls("new") == 9
    fresh.models["a0:1"].wait_s.update(0.2)                                 # a0 keeps its calls waiting
    assert fresh.choose(RouteRequest("long", prompt(16, 300)), set()).address == "a1:1"
    clock = [100.0]
    aging = CostAwareRouter(fleet(2), clock=lambda: clock[0])
    ready(aging, aging.actors)
    old = prompt_hashes(prompt(17), LAYOUT)
    report(aging, "a0:1", old)                                              # stored at t=100 ...
    clock[0] = 130.0
    report(aging, "a0:1", evicted=old)                                      # ... evicted unused 30 s later
    assert aging.models["a0:1"].horizon_s() == pytest.approx(30.0)
    assert aging.models["a1:1"].horizon_s() == float("inf")
    for gap in (1.0, 2.0, 50.0, 60.0):
        aging.gaps.add(gap)
    assert aging.gaps.survival(30.0) == 0.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(1, 10_000)), max_size=60))
def test_pending_tokens_are_the_sum_of_the_pending_calls(steps):
    """The router reads an actor's pending prefill tokens at every call, kept as calls come, are replaced and go:
    after any sequence of them it equals the sum over the calls still pending."""
    from forge.gateway.routing.fleet import ActorModel

    model = ActorModel("a:1")
    for add, key, tokens in steps:
        if add:
            model.pending[key] = Pending(tokens, 0.0, 0.0)
        else:
            model.pending.pop(key)
        assert model.pending_tokens == sum(p.compute_tokens for p in model.pending.values())
    model.pending = PendingCalls({1: Pending(5, 0.0, 0.0), 2: Pending(7, 0.0, 0.0)})
    assert model.pending_tokens == 12 and len(model.pending) == 2
