"""Routing policies and the L3 KV cache on multi-turn agent sessions: a trace-driven simulation and a real run.

Workload (both parts): groups of G rollouts of one task arrive as a Poisson process; each group shares one of a few
long system prompts (Zipf popularity) and a task prompt; each session then runs a skewed number of turns (Pareto),
each turn appending a tool result of skewed length, calling the model for a completion of skewed length, and
waiting a skewed tool/think time before the next turn. Every call's prompt is the session's whole context.

- **Simulation**: N actors, each a continuous-batching engine with the torch engine's rules (prefill before decode,
  chunked prefill within a token budget, a request whose first block is being computed waits a step and then hits,
  an LRU KV cache of blocks, a batch slot limit) and a cost model: a prefill step takes overhead + tokens /
  throughput, a decode step base + per-sequence time (some actors slower: their speeds must be learned). With the
  L3 cache, actors publish every computed block and, on a local miss, fetch blocks the cache holds when that is
  cheaper than recomputing (bytes / bandwidth vs tokens / throughput). Routers are the gateway's own objects
  (round-robin and least-loaded with session affinity, the gateway default; cache-aware; kv-overlap; cost-aware),
  fed the actors' KV events and figures every poll interval and the calls' timings, exactly as in the gateway.
- **Real run**: forge-cache, N forge-actor processes (built-in tiny model on CPU, --l3-cache) and, per policy, a
  gateway with that --router; sessions replay the same trace shape through the gateway's gRPC Generate (token
  ids; tokens differ per policy so no policy inherits another's cache, lengths and timings are identical).

Reported per policy: mean, p50 and p99 time to first token; the prefix hit rate (prompt tokens served from a KV
cache, local or L3) against the oracle's (every block ever computed available everywhere); the share fetched from
L3; load imbalance (max / mean of per-actor busy time in the simulation, of per-actor prefill tokens computed in
the real run); for the KV-aware routers the mean absolute error of their TTFT estimate.

With ``--part pd`` the simulation instead compares, under the cost-aware router, the 8 actors co-located against the
same actors split into P prefill and 8 - P decode actors (``--pd-splits``), by the gateway's rules and its own
``PrefillPool``: a call with at least 64 tokens not cached on a decode actor is prefilled on the least queued prefill
actor (a session keeps its own while it is not a prompt busier), its blocks go to L3, and its decode actor fetches
what it lacks and continues; reported: TTFT and time per output token (mean, p99) and the p99 gap between a call's consecutive tokens
(where a prefill step that stalls the decodes shows). ``--workload long-prompts``
makes most of each prompt new (long documents and tool results).

Usage: python bench/cache_router.py [--quick] [--part sim|real|both|pd] [--seeds 0 1 2] [--load 1] [--actors 3]
       [--workload agent|long-prompts] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from array import array
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from forge.gateway.prefill import PrefillPool
from forge.gateway.routing import ActorEndpoint, KVRouter, RouteRequest, make_router, router_class
from forge.gateway.routing.fleet import Layout, leading
from forge.kvhash import block_hash, kv_salt
from forge.v1 import router_pb2

POLICIES = ("round-robin", "least-loaded", "cache-aware", "kv-overlap", "cost-aware")
BIN = Path(sys.executable).parent


# ====================================================================== workload

@dataclass(frozen=True)
class Workload:
    groups: int = 120
    group_size: int = 8
    groups_per_s: float = 0.5
    systems: int = 6
    system_len: tuple[int, int] = (2000, 4000)
    task_len: tuple[int, int] = (300, 1500)
    turns_alpha: float = 1.3             # Pareto shape of the number of turns (1 + ...), skewed
    max_turns: int = 40
    tool_median: float = 400             # tokens appended per turn (log-normal, sigma 1)
    output_median: float = 200           # completion tokens (log-normal, sigma 0.8)
    output_cap: int = 1500
    think_median_s: float = 2.0          # tool / think time between turns (log-normal, sigma 1)
    max_context: int = 32_000
    vocab: int = 1000


# ``--workload``: the agent sessions above, or sessions that each read a long document of their own and append long
# tool results (file reads, search pages), so most prompt tokens of a call are new: the case prefill/decode
# disaggregation is for.
WORKLOADS = {"agent": Workload(),
             "long-prompts": Workload(task_len=(6000, 12000), tool_median=1500, max_turns=8, output_median=300)}


@dataclass
class TurnSpec:
    gap_s: float
    new_len: int
    output_len: int


@dataclass
class SessionSpec:
    sid: str
    group: str
    start_s: float
    system: int
    task_len: int
    turns: list[TurnSpec]


def make_trace(w: Workload, seed: int) -> list[SessionSpec]:
    """Lengths and timings only; token contents come from ``Tokens``."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) for k in range(w.systems)]
    system_lens = [rng.randint(*w.system_len) for _ in range(w.systems)]
    sessions, t = [], 0.0
    for g in range(w.groups):
        t += rng.expovariate(w.groups_per_s)
        system = rng.choices(range(w.systems), weights)[0]
        task_len = rng.randint(*w.task_len)
        for member in range(w.group_size):
            turns = min(w.max_turns, 1 + int(rng.paretovariate(w.turns_alpha) - 1.0) * 2)
            context = system_lens[system] + task_len
            specs = []
            for k in range(turns):
                new = 0 if k == 0 else max(8, int(rng.lognormvariate(math.log(w.tool_median), 1.0)))
                out = min(w.output_cap, max(4, int(rng.lognormvariate(math.log(w.output_median), 0.8))))
                if context + new + out > w.max_context:
                    break
                gap = 0.0 if k == 0 else rng.lognormvariate(math.log(w.think_median_s), 1.0)
                specs.append(TurnSpec(gap, new, out))
                context += new + out
            sessions.append(SessionSpec(f"g{g}-s{member}", f"g{g}", t, system, task_len, specs))
    return sessions


class Tokens:
    """Deterministic token contents for a trace; another ``content_seed`` gives other tokens of the same lengths."""

    def __init__(self, w: Workload, trace_seed: int, content_seed: int) -> None:
        self.w = w
        self.content_seed = content_seed
        rng = random.Random(trace_seed)
        lens = [rng.randint(*w.system_len) for _ in range(w.systems)]
        self._memo: dict[tuple, list[int]] = {}
        self.systems = [self._ids(("system", s), n) for s, n in enumerate(lens)]

    def _ids(self, key: tuple, n: int) -> list[int]:
        if key not in self._memo:
            rng = random.Random(f"{self.content_seed}/{key}")
            self._memo[key] = rng.choices(range(self.w.vocab), k=n)
        return self._memo[key]

    def prompt_start(self, s: SessionSpec) -> list[int]:
        return self.systems[s.system] + self._ids(("task", s.group), s.task_len)

    def new(self, s: SessionSpec, turn: int) -> list[int]:
        return self._ids(("new", s.sid, turn), s.turns[turn].new_len)

    def output(self, s: SessionSpec, turn: int) -> list[int]:
        return self._ids(("out", s.sid, turn), s.turns[turn].output_len)


class Chain:
    """Chained block hashes of a growing token list, extended incrementally."""

    def __init__(self, block_size: int, salt: bytes) -> None:
        self.size, self.salt = block_size, salt
        self.tokens = array("i")
        self.hashes: list[bytes] = []

    def extend(self, ids: list[int]) -> None:
        self.tokens.extend(ids)
        parent = self.hashes[-1] if self.hashes else self.salt
        for start in range(len(self.hashes) * self.size, len(self.tokens) - self.size + 1, self.size):
            parent = block_hash(parent, self.tokens[start:start + self.size])
            self.hashes.append(parent)


def prefix_in(hashes: list[bytes], held) -> int:
    return leading(hashes, held.__contains__)


@dataclass
class Tally:
    """What one policy's runs measured; runs over several seeds pool their calls."""

    ttfts: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    hit_tokens: int = 0
    oracle_tokens: int = 0
    l3_tokens: int = 0
    imbalances: list[float] = field(default_factory=list)
    errors_ms: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)        # time per output token after the first, per call
    gaps: array = field(default_factory=lambda: array("d"))  # time between a call's consecutive tokens, every one

    def add(self, other: Tally) -> None:
        self.ttfts += other.ttfts
        self.tpots += other.tpots
        self.gaps += other.gaps
        self.prompt_tokens += other.prompt_tokens
        self.hit_tokens += other.hit_tokens
        self.oracle_tokens += other.oracle_tokens
        self.l3_tokens += other.l3_tokens
        self.imbalances += other.imbalances
        self.errors_ms += other.errors_ms

    def summary(self) -> dict[str, float]:
        p50, p99 = np.percentile(self.ttfts, [50, 99]) * 1e3
        tokens = max(1, self.prompt_tokens)
        return {"calls": len(self.ttfts), "ttft_mean_ms": float(np.mean(self.ttfts) * 1e3), "ttft_p50_ms": float(p50),
                "ttft_p99_ms": float(p99), "hit_rate": self.hit_tokens / tokens,
                "oracle_hit_rate": self.oracle_tokens / tokens, "l3_share": self.l3_tokens / tokens,
                "imbalance": float(np.mean(self.imbalances)),
                "ttft_abs_error_ms": float(np.mean(self.errors_ms)) if self.errors_ms else float("nan"),
                "tpot_mean_ms": float(np.mean(self.tpots) * 1e3) if self.tpots else float("nan"),
                "tpot_p99_ms": float(np.percentile(self.tpots, 99) * 1e3) if self.tpots else float("nan"),
                "token_gap_p99_ms": float(np.percentile(self.gaps, 99) * 1e3) if self.gaps else float("nan")}


# ====================================================================== simulation

@dataclass(frozen=True)
class Hardware:
    actors: int = 8
    speeds: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.6, 0.6)   # relative speed of each actor
    block_size: int = 16
    prefill_tps: float = 10_000.0        # prompt tokens per second at speed 1
    step_overhead_s: float = 0.005
    decode_base_s: float = 0.020
    decode_per_seq_s: float = 0.0003
    max_running: int = 64
    max_batched_tokens: int = 8192
    kv_blocks: int = 12_000              # per actor (192k tokens)
    l3: bool = True
    block_bytes: int = 5 * 2**20         # a 70B-class model's block of 16 tokens
    l3_bytes_per_s: float = 10e9
    l3_lookup_s: float = 0.001
    l3_blocks: int = 2_000_000
    poll_s: float = 0.2                  # how often the router sees KV events and figures
    prefill_actors: int = 0              # disaggregated: the first N actors prefill, the others decode
    prefill_min_tokens: int = 64         # a call with fewer tokens not cached on a decode actor skips the prefill


@dataclass(eq=False)
class SimCall:
    session: SimSession
    turn: int
    prompt_len: int
    hashes: list[bytes]
    output_len: int
    request: RouteRequest
    sent: float
    oracle_blocks: int
    actor: SimActor | None = None
    cached: int = 0
    fetched: int = 0
    remaining: int = 0
    generated: int = 0
    first_at: float = 0.0
    last_at: float = 0.0                 # when its last token came
    handover: bool = False               # on its prefill actor: ends at its first token, then moves to decode
    handed_over: bool = False            # on its decode actor after a prefill elsewhere: fetches what L3 holds
    decode_sent: float = 0.0


@dataclass(eq=False)
class SimSession:
    spec: SessionSpec
    chain: Chain                         # the session's whole context (every turn), hashed once per trace
    prompt_lens: list[int]
    turn: int = 0


def sim_sessions(trace: list[SessionSpec], tokens: Tokens, block_size: int) -> dict[str, tuple[Chain, list[int]]]:
    """Each session's final context and hash chain, and the prompt length of each turn."""
    salt = Layout(model_id="sim").salt
    contexts = {}
    for spec in trace:
        chain, lens = Chain(block_size, salt), []
        chain.extend(tokens.prompt_start(spec))
        for k in range(len(spec.turns)):
            if k:
                chain.extend(tokens.new(spec, k))
            lens.append(len(chain.tokens))
            chain.extend(tokens.output(spec, k))
        contexts[spec.sid] = (chain, lens)
    return contexts


class SimActor:
    def __init__(self, sim: Simulation, index: int, speed: float) -> None:
        hw = sim.hw
        self.sim, self.hw, self.speed = sim, hw, speed
        self.endpoint = ActorEndpoint(f"sim-actor-{index}:0")
        self.healthy = True
        self.in_flight = 0
        self.cache: OrderedDict[bytes, None] = OrderedDict()
        self.waiting: deque[SimCall] = deque()
        self.prefilling: list[SimCall] = []
        self.running: list[SimCall] = []
        self.busy = False
        self.busy_s = 0.0
        self.stored: list[bytes] = []
        self.evicted: list[bytes] = []
        self.last_decode_s = hw.decode_base_s / speed
        self.tps = hw.prefill_tps * speed

    def register(self, hashes: list[bytes]) -> None:
        for h in hashes:
            if h in self.cache:
                self.cache.move_to_end(h)
                continue
            self.cache[h] = None
            self.stored.append(h)
        while len(self.cache) > self.hw.kv_blocks:
            old, _ = self.cache.popitem(last=False)
            self.evicted.append(old)
        if self.hw.l3:
            self.sim.l3_publish(hashes)

    def submit(self, call: SimCall) -> None:
        """The call arrives; on a local miss, L3 blocks are fetched when cheaper than recomputing."""
        call.actor = self
        hw, n = self.hw, len(call.hashes)
        local = prefix_in(call.hashes, self.cache)
        delay = 0.0
        if hw.l3 and local < n and (call.handed_over or (n - local) * hw.block_size / self.tps > hw.l3_lookup_s):
            delay = hw.l3_lookup_s
            available = prefix_in(call.hashes[local:], self.sim.l3)
            per_block = hw.block_bytes / hw.l3_bytes_per_s
            if available and (call.handed_over or per_block < hw.block_size / self.tps):
                delay += available * per_block
                call.fetched = available
        self.sim.at(self.sim.now + delay, lambda: self._arrive(call, local))

    def _arrive(self, call: SimCall, local: int) -> None:
        if call.fetched:
            self.register(call.hashes[local:local + call.fetched])
        self.waiting.append(call)
        self.kick()

    def kick(self) -> None:
        if not self.busy and (self.waiting or self.prefilling or self.running):
            self.busy = True
            self._step()

    def _step(self) -> None:
        hw = self.hw
        budget = hw.max_batched_tokens
        chunks: list[tuple[SimCall, int]] = []
        for call in self.prefilling:
            take = min(call.remaining, budget)
            if take:
                chunks.append((call, take))
                budget -= take
        computing: set[bytes] = set()
        for call in self.prefilling:
            computing.update(call.hashes[call.cached:])
        deferred = []
        while self.waiting and len(self.running) + len(self.prefilling) < hw.max_running and budget > 0:
            call = self.waiting[0]
            cached = prefix_in(call.hashes, self.cache)
            if cached < len(call.hashes) and call.hashes[cached] in computing:
                deferred.append(self.waiting.popleft())
                continue
            self.waiting.popleft()
            call.cached = cached
            for h in call.hashes[:call.cached]:
                self.cache.move_to_end(h)
            call.remaining = max(1, call.prompt_len - call.cached * hw.block_size)
            computing.update(call.hashes[call.cached:])
            self.prefilling.append(call)
            take = min(call.remaining, budget)
            chunks.append((call, take))
            budget -= take
        self.waiting.extendleft(reversed(deferred))
        if chunks:
            tokens = sum(t for _, t in chunks)
            duration = hw.step_overhead_s / self.speed + tokens / self.tps
            self.sim.at(self.sim.now + duration, lambda: self._prefilled(chunks, duration))
        elif self.running:
            duration = (hw.decode_base_s + hw.decode_per_seq_s * len(self.running)) / self.speed
            self.last_decode_s = duration
            self.sim.at(self.sim.now + duration, lambda: self._decoded(duration))
        else:
            self.busy = False

    def _prefilled(self, chunks: list[tuple[SimCall, int]], duration: float) -> None:
        self.busy_s += duration
        for call, take in chunks:
            call.remaining -= take
            if call.remaining == 0:
                self.prefilling.remove(call)
                self.register(call.hashes)
                if call.handover:
                    self.sim.hand_over(call)
                    continue
                call.generated = 1
                self.sim.first_token(call)
                if call.generated >= call.output_len:
                    self.sim.finish(call)
                else:
                    self.running.append(call)
        self.busy = False
        self.kick()

    def _decoded(self, duration: float) -> None:
        self.busy_s += duration
        now, gaps = self.sim.now, self.sim.tally.gaps
        for call in list(self.running):
            call.generated += 1
            gaps.append(now - call.last_at)
            call.last_at = now
            if call.generated >= call.output_len:
                self.running.remove(call)
                self.sim.finish(call)
        self.busy = False
        self.kick()

    def kv_events(self) -> router_pb2.KVEvents:
        hw = self.hw
        layout = router_pb2.KVCacheLayout(model_id="sim", weight_version=0, block_size=hw.block_size,
                                          block_bytes=hw.block_bytes, num_blocks=hw.kv_blocks,
                                          max_running=hw.max_running, l3=hw.l3)
        figures = {"prefill_tokens_per_s": self.tps, "decode_step_s": self.last_decode_s,
                   "running": float(len(self.running) + len(self.prefilling)), "waiting": float(len(self.waiting))}
        if hw.l3:
            figures.update(l3_fetch_bytes_per_s=hw.l3_bytes_per_s, l3_lookup_s=hw.l3_lookup_s)
        answer = router_pb2.KVEvents(epoch="sim", layout=layout, figures=figures)
        if self.evicted:
            answer.events.add(kind=router_pb2.KVEvent.KIND_EVICTED, block_hashes=self.evicted)
        if self.stored:
            answer.events.add(kind=router_pb2.KVEvent.KIND_STORED, block_hashes=self.stored)
        self.stored, self.evicted = [], []
        return answer


class Simulation:
    def __init__(self, trace: list[SessionSpec], contexts: dict[str, tuple[Chain, list[int]]], hw: Hardware,
                 policy: str) -> None:
        self.hw, self.contexts, self.trace = hw, contexts, trace
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = 0
        speeds = [hw.speeds[i % len(hw.speeds)] for i in range(hw.actors)]
        self.actors = [SimActor(self, i, speeds[i]) for i in range(hw.actors)]
        self.by_address = {a.endpoint.address: a for a in self.actors}
        prefill, self.decode = self.actors[:hw.prefill_actors], self.actors[hw.prefill_actors:]
        self.prefill = PrefillPool(prefill, hw.prefill_min_tokens)
        kind = router_class(policy)
        if issubclass(kind, KVRouter):
            self.router = kind(self.decode, True, clock=lambda: self.now, prior_prefill_tps=hw.prefill_tps)
        else:
            self.router = make_router(policy, self.decode, session_affinity=True)
        self.prefills = 0
        self.l3: OrderedDict[bytes, None] = OrderedDict()
        self.oracle: set[bytes] = set()
        self.live = 0
        self.tally = Tally()

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._order += 1
        heapq.heappush(self._events, (t, self._order, fn))

    def l3_publish(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self.l3[h] = None
            self.l3.move_to_end(h)
        while len(self.l3) > self.hw.l3_blocks:
            self.l3.popitem(last=False)

    def run(self) -> Tally:
        for spec in self.trace:
            if spec.turns:
                self.live += 1
                self.at(spec.start_s, lambda spec=spec: self.start_session(spec))
        if hasattr(self.router, "apply"):
            self.at(0.0, self.poll)
        while self._events:
            self.now, _, fn = heapq.heappop(self._events)
            fn()
        busy = [a.busy_s for a in self.actors]
        self.tally.imbalances.append(max(busy) / statistics.mean(busy))
        error = getattr(self.router, "abs_error_s", None)
        if error is not None:
            self.tally.errors_ms.append(error.value * 1e3)
        return self.tally

    def poll(self) -> None:
        for actor in self.decode:
            self.router.apply(actor.endpoint.address, actor.kv_events())
        if self.live:
            self.at(self.now + self.hw.poll_s, self.poll)

    def start_session(self, spec: SessionSpec) -> None:
        self.call(SimSession(spec, *self.contexts[spec.sid]))

    def call(self, session: SimSession) -> None:
        spec, k = session.spec, session.turn
        prompt_len = session.prompt_lens[k]
        hashes = session.chain.hashes[:(prompt_len - 1) // self.hw.block_size]
        ids = list(session.chain.tokens[:prompt_len])
        request = RouteRequest(spec.sid, ids, spec.turns[k].output_len)
        oracle = prefix_in(hashes, self.oracle)
        self.oracle.update(hashes)
        call = SimCall(session, k, prompt_len, hashes, spec.turns[k].output_len, request, self.now, oracle)
        pool = self.prefill
        if pool.actors and pool.wanted(prompt_len, self.router.cached_tokens(request)):
            self.prefills += 1
            call.handover = True
            prefill = pool.choose(spec.sid, prompt_len, set())
            pool.started(spec.sid, prefill.endpoint.address, prompt_len)
            prefill.in_flight += 1
            prefill.submit(call)
            return
        self.to_decode(call)

    def to_decode(self, call: SimCall) -> None:
        call.decode_sent = self.now
        actor = self.by_address[self.router.choose(call.request, set()).address]
        actor.in_flight += 1
        actor.submit(call)

    def hand_over(self, call: SimCall) -> None:
        """A prefill is done, its blocks in L3: the call continues on a decode actor (its first token waits)."""
        prefill = call.actor
        self.prefill.finished(prefill.endpoint.address, call.prompt_len)
        prefill.in_flight -= 1
        call.handover, call.handed_over = False, True
        call.cached = call.fetched = call.remaining = 0
        self.to_decode(call)

    def first_token(self, call: SimCall) -> None:
        ttft = self.now - call.sent
        call.first_at = call.last_at = self.now
        tally, size = self.tally, self.hw.block_size
        tally.ttfts.append(ttft)
        tally.prompt_tokens += call.prompt_len
        tally.hit_tokens += min(call.cached * size, call.prompt_len - 1)
        tally.oracle_tokens += call.oracle_blocks * size
        tally.l3_tokens += min(call.fetched, call.cached) * size
        self.router.on_first_token(call.request, call.actor.endpoint.address, self.now - call.decode_sent)

    def finish(self, call: SimCall) -> None:
        actor, session = call.actor, call.session
        if call.output_len > 1:
            self.tally.tpots.append((self.now - call.first_at) / (call.output_len - 1))
        actor.in_flight -= 1
        self.router.on_done(call.request, actor.endpoint.address)
        done = session.chain.hashes[:(call.prompt_len + call.output_len - 1) // self.hw.block_size]
        actor.register(done[len(call.hashes):])
        self.oracle.update(done)
        session.turn += 1
        if session.turn < len(session.spec.turns):
            self.at(self.now + session.spec.turns[session.turn].gap_s, lambda: self.call(session))
        else:
            self.live -= 1
            self.router.forget(session.spec.sid)


def run_simulation(w: Workload, hw: Hardware, seeds: list[int], policies: tuple[str, ...]) -> dict[str, dict]:
    """Every policy on the traces of every seed; each policy's calls are pooled over the seeds."""
    tallies = {policy: Tally() for policy in policies}
    for seed in seeds:
        trace, contexts = traced(w, seed, hw.block_size)
        for policy in policies:
            tallies[policy].add(Simulation(trace, contexts, hw, policy).run())
    return {policy: tally.summary() for policy, tally in tallies.items()}


_TRACES: dict[tuple, tuple] = {}


def traced(w: Workload, seed: int, block_size: int) -> tuple:
    """The trace of ``seed`` and its sessions' contexts, made once per workload, seed and block size."""
    key = (w, seed, block_size)
    if key not in _TRACES:
        trace = make_trace(w, seed)
        _TRACES[key] = trace, sim_sessions(trace, Tokens(w, seed, content_seed=seed), block_size)
    return _TRACES[key]


def run_pd(w: Workload, hw: Hardware, seeds: list[int], splits: list[int]) -> dict[str, dict]:
    """The cost-aware router over co-located actors against the same actors split into P prefill and the rest
    decode, for each P in ``splits`` (0: co-located); calls pooled over the seeds."""
    results = {}
    for prefill in splits:
        tally, prefills, calls = Tally(), 0, 0
        for seed in seeds:
            trace, contexts = traced(w, seed, hw.block_size)
            sim = Simulation(trace, contexts, replace(hw, prefill_actors=prefill), "cost-aware")
            tally.add(sim.run())
            prefills += sim.prefills
        calls = len(tally.ttfts)
        label = "co-located" if not prefill else f"{prefill} prefill + {hw.actors - prefill} decode"
        results[label] = {**tally.summary(), "through_prefill": prefills / max(1, calls)}
    return results


def pd_table(title: str, results: dict[str, dict]) -> str:
    lines = [title, f"{'set-up':<22} {'calls':>6} {'TTFT mean':>10} {'p99':>9} {'TPOT mean':>10} {'p99':>8} "
             f"{'token gap p99':>14} {'hit rate':>9} {'prefilled apart':>16}"]
    for label, r in results.items():
        lines.append(f"{label:<22} {r['calls']:>6} {r['ttft_mean_ms']:>7.0f} ms {r['ttft_p99_ms']:>6.0f} ms "
                     f"{r['tpot_mean_ms']:>7.1f} ms {r['tpot_p99_ms']:>5.1f} ms {r['token_gap_p99_ms']:>11.1f} ms "
                     f"{r['hit_rate']:>9.1%} {r['through_prefill']:>16.0%}")
    return "\n".join(lines)


# ====================================================================== real run

class Service:
    """A child process that writes a ready file (``--ready-file``) once serving."""

    def __init__(self, args: list[str], root: Path, name: str) -> None:
        self.ready, self.log = root / f"{name}.json", root / f"{name}.log"
        self.ready.unlink(missing_ok=True)
        with self.log.open("ab") as handle:
            self.proc = subprocess.Popen([*args, "--ready-file", str(self.ready)], stdout=handle,
                                         stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.info: dict = {}

    def wait(self, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{self.log.name} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        self.info = json.loads(self.ready.read_text())
        return self.info

    def pause(self, paused: bool) -> None:
        """Freeze (SIGSTOP) or resume (SIGCONT) the process: an idle gateway must not poll the actors."""
        self.proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self) -> None:
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class RealStats(Tally):
    computed: dict[str, int] = field(default_factory=lambda: defaultdict(int))   # prefill tokens per actor
    failures: int = 0

    def add(self, other: RealStats) -> None:
        super().add(other)
        for actor, tokens in other.computed.items():
            self.computed[actor] += tokens
        self.failures += other.failures


async def replay(gateway: str, trace: list[SessionSpec], tokens: Tokens, block_size: int, group_size: int,
                 tag: str) -> RealStats:
    import grpc

    from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

    stats = RealStats()
    oracle: set[bytes] = set()
    salt = kv_salt("oracle", 0)
    origin = time.monotonic()
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def session(spec: SessionSpec) -> None:
            await asyncio.sleep(max(0.0, spec.start_s - (time.monotonic() - origin)))
            group = f"{tag}-{spec.group}"
            opened = await stub.StartSession(gateway_pb2.StartSessionRequest(task_id=group, group_id=group,
                                                                             group_size=group_size))
            sid = opened.session.session_id
            chain = Chain(block_size, salt)
            context = tokens.prompt_start(spec)
            chain.extend(context)
            for k, turn in enumerate(spec.turns):
                if k:
                    await asyncio.sleep(turn.gap_s)
                    new = tokens.new(spec, k)
                    context += new
                    chain.extend(new)
                hashes = chain.hashes[:(len(context) - 1) // block_size]
                oracle_blocks = prefix_in(hashes, oracle)
                oracle.update(hashes)
                sampling = common_pb2.SamplingParams(temperature=1.0, seed=zlib.crc32(f"{spec.sid}/{k}".encode()),
                                                     max_tokens=turn.output_len, ignore_eos=True)
                sent = time.monotonic()
                ttft, cached, actor, completion = None, 0, "", []
                try:
                    async for chunk in stub.Generate(gateway_pb2.SessionGenerateRequest(
                            session_id=sid, prompt_ids=context, sampling=sampling)):
                        if ttft is None and chunk.token_ids:
                            ttft = time.monotonic() - sent
                            cached, actor = chunk.cached_prompt_tokens, chunk.actor
                        completion.extend(chunk.token_ids)
                except grpc.aio.AioRpcError:
                    stats.failures += 1
                    return
                stats.ttfts.append(ttft)
                stats.prompt_tokens += len(context)
                stats.hit_tokens += cached
                stats.oracle_tokens += oracle_blocks * block_size
                stats.computed[actor] += len(context) - cached
                context = context + completion
                chain.extend(completion)
                oracle.update(chain.hashes)
            await stub.EndSession(gateway_pb2.EndSessionRequest(session_id=sid, outcome_rewards={"r": 0.0}))

        await asyncio.gather(*(session(s) for s in trace if s.turns))
    return stats


def actor_counter(address: str, name: str) -> float:
    from forge.rpc import connect
    from forge.v1 import actor_pb2_grpc, common_pb2

    channel = connect(address)
    try:
        return actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest(), timeout=10).gauges.get(name, 0.0)
    finally:
        channel.close()


def gateway_gauges(address: str) -> dict[str, float]:
    from forge.rpc import connect
    from forge.v1 import common_pb2, gateway_pb2_grpc

    channel = connect(address)
    try:
        return dict(gateway_pb2_grpc.GatewayStub(channel).Stats(common_pb2.StatsRequest(), timeout=10).gauges)
    finally:
        channel.close()


def run_real(w: Workload, seed: int, policies: tuple[str, ...], actors: int, kv_mb: int, repeats: int
             ) -> dict[str, dict]:
    """One forge-cache, ``actors`` forge-actor processes and a gateway per policy (all started at once); the
    policies replay the trace in turn, ``repeats`` times in rotated order, each time with fresh token contents."""
    root = Path(tempfile.mkdtemp(prefix="forge-cache-router-"))
    services: list[Service] = []
    try:
        cache = Service([sys.executable, "-m", "forge.cache", "--dir", str(root / "l3"), "--port", "0",
                         "--capacity-mb", "2048", "--log-level", "WARNING"], root, "cache")
        services.append(cache)
        l3 = cache.wait()["address"]
        workers = [Service([str(BIN / "forge-actor"), "--port", "0", "--threads", "1", "--kv-cache-mb", str(kv_mb),
                            "--max-batch", "32", "--l3-cache", l3, "--name", f"actor-{i}", "--log-level", "WARNING"],
                           root, f"actor{i}") for i in range(actors)]
        services += workers
        addresses = [worker.wait()["address"] for worker in workers]
        gateways = {policy: Service([sys.executable, "-m", "forge.gateway", *[x for a in addresses for x in
                                     ("--actor", a)], "--pool", str(root / f"pool-{policy}"), "--grpc-port", "0",
                                     "--http-port", "0", "--router", policy, "--log-level", "WARNING"], root,
                                    f"gateway-{policy}") for policy in policies}
        services += gateways.values()
        routes = {policy: gateway.wait()["grpc_address"] for policy, gateway in gateways.items()}
        for gateway in gateways.values():
            gateway.pause(True)

        def run(policy: str, trace: list[SessionSpec], tokens: Tokens, tag: str) -> RealStats:
            gateway = gateways[policy]
            gateway.pause(False)
            time.sleep(0.5)                                      # health checks and a KV event poll catch up
            try:
                return asyncio.run(replay(routes[policy], trace, tokens, 16, w.group_size, tag))
            finally:
                gateway.pause(True)

        trace = make_trace(w, seed)
        run(policies[0], trace[:2], Tokens(w, seed, 10_000), "warm-up")             # torch, gRPC, the pool
        merged = {policy: RealStats() for policy in policies}
        fetched = dict.fromkeys(policies, 0.0)
        for repeat in range(repeats):
            for offset in range(len(policies)):
                policy = policies[(offset + repeat) % len(policies)]
                before = sum(actor_counter(a, "l3_fetched_blocks") for a in addresses)
                tokens = Tokens(w, seed, content_seed=seed + 1 + repeat * len(POLICIES) + POLICIES.index(policy))
                merged[policy].add(run(policy, trace, tokens, f"r{repeat}"))
                fetched[policy] += sum(actor_counter(a, "l3_fetched_blocks") for a in addresses) - before
        results = {}
        for policy in policies:
            stats = merged[policy]
            computed = [stats.computed.get(f"actor-{i}", 0) for i in range(actors)]
            stats.imbalances.append(max(computed) / max(1e-9, statistics.mean(computed)))
            stats.l3_tokens = int(fetched[policy] * 16)
            gateways[policy].pause(False)
            error = gateway_gauges(routes[policy]).get("router_ttft_abs_error_ms")
            if error is not None:
                stats.errors_ms.append(error)
            results[policy] = {**stats.summary(), "failed_calls": stats.failures}
        return results
    finally:
        for service in reversed(services):
            service.terminate()
        for service in services:
            service.wait_exit()


# ====================================================================== report

def table(title: str, results: dict[str, dict]) -> str:
    lines = [title, f"{'policy':<13} {'calls':>6} {'TTFT mean':>10} {'p50':>8} {'p99':>9} {'hit rate':>9} "
             f"{'oracle':>7} {'L3 share':>9} {'imbalance':>10} {'est. err':>9}"]
    for policy, r in results.items():
        error = "" if math.isnan(r["ttft_abs_error_ms"]) else f"{r['ttft_abs_error_ms']:.0f} ms"
        lines.append(f"{policy:<13} {r['calls']:>6} {r['ttft_mean_ms']:>7.0f} ms {r['ttft_p50_ms']:>5.0f} ms "
                     f"{r['ttft_p99_ms']:>6.0f} ms {r['hit_rate']:>9.1%} {r['oracle_hit_rate']:>7.1%} "
                     f"{r['l3_share']:>9.1%} {r['imbalance']:>10.2f} {error:>9}")
    best_mean = min(results, key=lambda p: results[p]["ttft_mean_ms"])
    best_p99 = min(results, key=lambda p: results[p]["ttft_p99_ms"])
    lines.append(f"best mean TTFT: {best_mean}; best p99 TTFT: {best_p99}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small trace of each part (under a minute)")
    parser.add_argument("--part", choices=["sim", "real", "both", "pd"], default="both",
                        help="pd: the simulation's co-located actors against prefill/decode pools (cost-aware)")
    parser.add_argument("--pd-splits", type=int, nargs="+", default=[0, 2, 3, 4],
                        help="pd: prefill actors out of the 8 simulated (0: co-located)")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="simulation traces (pooled) [default: 0 with --quick, else 0 1 2]; the real run uses the first")
    parser.add_argument("--actors", type=int, default=3, help="forge-actor processes in the real run")
    parser.add_argument("--load", type=float, default=1.0, help="multiply the simulated arrival rate of groups")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="agent",
                        help="the simulated sessions: agent turns, or long-prompts (most prompt tokens new)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    policies = tuple(args.policies)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    out: dict[str, dict] = {}
    sim_w = WORKLOADS[args.workload]
    sim_w = replace(sim_w, groups=12, group_size=6) if args.quick else sim_w
    sim_w = replace(sim_w, groups_per_s=sim_w.groups_per_s * args.load)
    if args.part in ("sim", "both"):
        for l3 in (True, False):
            label = f"sim, {len(seeds)} trace(s) pooled, load x{args.load:g}, L3 {'on' if l3 else 'off'}"
            hw = replace(Hardware(), l3=l3)
            out[label] = run_simulation(sim_w, hw, seeds, policies)
    if args.part == "pd":
        label = (f"sim, {args.workload}, {len(seeds)} trace(s) pooled, load x{args.load:g}: co-located against "
                 "prefill/decode pools")
        out[label] = run_pd(sim_w, Hardware(), seeds, args.pd_splits)
        if args.json:
            print(json.dumps(out, indent=2))
            return
        for label, results in out.items():
            print(pd_table(label, results))
        return
    if args.part in ("real", "both"):
        real_w = Workload(groups=18, group_size=4, groups_per_s=1.5, systems=3, system_len=(350, 650),
                          task_len=(40, 120), max_turns=6, tool_median=60, output_median=10, output_cap=24,
                          think_median_s=0.3, max_context=1900, vocab=1000)
        if args.quick:
            real_w = replace(real_w, groups=5, groups_per_s=3.0, max_turns=4, think_median_s=0.1)
        out[f"real, {args.actors} CPU actors, L3 on"] = run_real(real_w, seeds[0], policies, args.actors,
                                                                 kv_mb=24, repeats=1 if args.quick else 3)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for label, results in out.items():
        print(table(label, results))
        print()


if __name__ == "__main__":
    main()
