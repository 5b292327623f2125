"""The shared base of the routers that know where KV prefixes live: each actor's cached blocks, its speeds, and the
estimated time to first token of a call there. Subclasses only pick among the estimated options.

Each actor's cached blocks come from its KV events (``forge.v1.KVEventSource``, polled every ``poll_interval_s``;
see ``forge.kv.events``) plus the prompt blocks of calls just routed to it; the prompt's chain of block hashes is
computed with ``forge.kvhash`` under each actor's salt (model, weight version, variant) and block size, which the
same poll reports together with the actor's measured speeds. For every candidate the router estimates the time to
first token:

    queue (prompt tokens routed here and not yet prefilled / prefill throughput, + waiting for a batch slot)
  + prefill of the tokens it would compute (prompt - cached prefix) / prefill throughput
  + migration of the blocks it would fetch from L3 (bytes / fetch bandwidth + a lookup)

scaled by a per-actor calibration (EWMA of actual / estimated time to first token of its completed calls). The
policies built on it: ``cost_aware``, ``cache_aware``, ``kv_overlap``.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from forge.gateway.routing.base import ActorEndpoint, ActorView, NoActorAvailable, Router, RouteRequest, candidates
from forge.gateway.routing.fleet import ActorModel, L3Model, Layout, Pending, Sample
from forge.kvhash import block_hash, leading
from forge.meters import Ewma
from forge.v1 import router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)

MAX_FOOTPRINTS = 20_000          # live sessions whose blocks are counted in their home's footprint


@dataclass
class Option:
    """One actor as a candidate for one call, with what the cost model expects there."""

    view: ActorView
    model: ActorModel
    order: int
    hashes: list[bytes]
    local: int = 0              # leading prompt blocks cached on the actor
    fetch: int = 0              # blocks after those it would fetch from L3
    evicts: int = 0             # blocks of live sessions its new blocks would push out of the actor's KV cache
    compute_tokens: int = 0
    estimate_s: float = 0.0
    raw_s: float = 0.0          # the estimate before calibration

    @property
    def address(self) -> str:
        return self.view.endpoint.address

    @property
    def in_flight(self) -> int:
        return self.view.in_flight


class KVRouter(Router):
    """The shared machinery: actor models, KV event polling, prefix estimates, feedback. Subclasses pick. They keep
    a session near its cache themselves (a preference, never an overload), so the gateway does not wrap them. An
    actor that joins gets a fresh model and is polled from the next round; one that leaves takes its model, and the
    sessions and groups placed there, with it."""

    name = "kv"
    handles_session_affinity = True
    unsupported_retry_s = 30.0       # an actor that serves no KV events (UNIMPLEMENTED) is asked again after this
    failed_retry_s = 1.0             # and one whose poll failed otherwise after this

    def __init__(self, actors: Sequence[ActorView], session_affinity: bool = True, *, poll_interval_s: float = 0.2,
                 prior_prefill_tps: float = 2000.0, share_cap: float = 2.0, min_cap: int = 8,
                 prefer_slack: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, max_remembered: int = 100_000) -> None:
        super().__init__(actors, session_affinity)
        self.poll_interval_s = poll_interval_s
        self.share_cap = share_cap
        self.min_cap = min_cap
        self.prefer_slack = prefer_slack
        self.clock = clock
        self.max_remembered = max_remembered
        self.prior_prefill_tps = prior_prefill_tps
        self.models = {a.endpoint.address: ActorModel(a.endpoint.address, prior_prefill_tps) for a in actors}
        self.l3 = L3Model()
        self.homes: OrderedDict[str, str] = OrderedDict()
        self.groups: OrderedDict[str, str] = OrderedDict()
        self.decisions: Counter[str] = Counter()
        self.error_s = Ewma(0.0, alpha=0.05)
        self.abs_error_s = Ewma(0.0, alpha=0.05)
        self.rel_error = Ewma(0.0, alpha=0.05)
        self.observed = 0
        self._turn = itertools.count()
        self._hashes: OrderedDict[int, tuple[RouteRequest, dict]] = OrderedDict()
        self._chains: OrderedDict[str, tuple[array, dict]] = OrderedDict()   # per session: its last prompt's chains
        self._homed: OrderedDict[str, tuple[ActorModel, list[bytes]]] = OrderedDict()   # live footprint per session
        self.calls_of: OrderedDict[str, int] = OrderedDict()       # calls so far of each live session
        self.ended_at: OrderedDict[str, float] = OrderedDict()     # when each live session's last call ended
        self.gaps = Sample()                                        # times between a session's calls
        self.session_lengths: Counter[int] = Counter()             # calls of each session forgotten so far
        self._started: dict[tuple[int, str], tuple[float, int]] = {}
        self._task: asyncio.Task | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._stubs: dict[str, router_pb2_grpc.KVEventSourceStub] = {}
        self._retry_at: dict[str, float] = {}

    # ------------------------------------------------------------------ the Router interface

    def choose(self, request: RouteRequest, exclude: set[str]) -> ActorEndpoint:
        allowed = candidates(self.actors, exclude)
        turn = next(self._turn)
        options = [self.option(request, view, (i - turn) % len(allowed)) for i, view in enumerate(allowed)]
        chosen, reason = self.pick(request, options)
        self.decisions[reason] += 1
        self._commit(request, chosen)
        return chosen.view.endpoint

    def cached_tokens(self, request: RouteRequest) -> int | None:
        try:
            allowed = candidates(self.actors, set())
        except NoActorAvailable:
            return None
        cached = 0
        for view in allowed:
            model = self.model(view.endpoint.address)
            cached = max(cached, model.blocks.prefix(self.hashes_for(request, model)) * model.block_size)
        return cached

    def model(self, address: str) -> ActorModel:
        """The model of the actor at ``address``; a fresh one for an actor not seen before."""
        model = self.models.get(address)
        if model is None:
            model = self.models[address] = ActorModel(address, self.prior_prefill_tps)
        return model

    def on_actor_added(self, view: ActorView) -> None:
        """A new actor (or a new process at an address seen before): a fresh model, polled from the next round."""
        address = view.endpoint.address
        self.models[address] = ActorModel(address, self.prior_prefill_tps)
        self._stubs.pop(address, None)          # made on the channel of the actor that was here before
        self._retry_at.pop(address, None)

    def on_actor_removed(self, address: str) -> None:
        """Forget the actor's model (its cached blocks, speeds, calls pending there) and every session and group
        placed there: their next call is placed afresh."""
        model = self.models.pop(address, None)
        self._stubs.pop(address, None)
        self._retry_at.pop(address, None)
        for table in (self.homes, self.groups):
            for key in [k for k, home in table.items() if home == address]:
                del table[key]
        for session_id in [s for s, (homed, _) in self._homed.items() if homed is model]:
            del self._homed[session_id]
        for key in [k for k in self._started if k[1] == address]:
            del self._started[key]

    @abc.abstractmethod
    def pick(self, request: RouteRequest, options: list[Option]) -> tuple[Option, str]:
        """The option to take among the candidates' and a short reason (counted in ``router_decisions/REASON``)."""

    def forget(self, session_id: str) -> None:
        self.homes.pop(session_id, None)
        self._chains.pop(session_id, None)
        homed = self._homed.pop(session_id, None)
        if homed is not None:
            homed[0].hold(homed[1], -1)
        self.ended_at.pop(session_id, None)
        calls = self.calls_of.pop(session_id, 0)
        if calls:
            self.session_lengths[calls] += 1

    def remaining_calls(self, session_id: str) -> float:
        """Expected further calls of a session after this one, from the lengths of the sessions seen end."""
        done = self.calls_of.get(session_id, 0) if session_id else 0
        longer = [(n, count) for n, count in self.session_lengths.items() if n > done]
        total = sum(count for _, count in longer)
        if not total:
            return 0.0 if self.session_lengths or not session_id else 1.0
        return sum((n - done - 1) * count for n, count in longer) / total

    def on_first_token(self, request: RouteRequest, address: str, ttft_s: float) -> None:
        """Feedback: the call's first token came ``ttft_s`` after it was sent to ``address``."""
        model = self.models.get(address)
        pending = model.pending.pop(id(request), None) if model else None
        if pending is None:
            return
        self.observed += 1
        self.error_s.update(pending.estimate_s - ttft_s)
        self.abs_error_s.update(abs(pending.estimate_s - ttft_s))
        self.rel_error.update(abs(pending.estimate_s - ttft_s) / max(ttft_s, 1e-3))
        if pending.raw_s > 0:
            model.calibration.update(min(5.0, max(0.2, ttft_s / pending.raw_s)))
        model.wait_s.update(max(0.0, ttft_s - pending.compute_tokens / max(model.prefill_tps.value, 1.0)))

    def on_done(self, request: RouteRequest, address: str) -> None:
        """Feedback: the call on ``address`` ended (finished, failed or moved on)."""
        model = self.models.get(address)
        if model is None:
            return
        model.pending.pop(id(request), None)
        if request.session_id:
            self.ended_at[request.session_id] = self.clock()
            self.ended_at.move_to_end(request.session_id)
            while len(self.ended_at) > self.max_remembered:
                self.ended_at.popitem(last=False)
        started = self._started.pop((id(request), address), None)
        if started is not None:
            model.service_s.update(self.clock() - started[0])
            model.active_blocks -= started[1]

    # ------------------------------------------------------------------ estimates

    def hashes_for(self, request: RouteRequest, model: ActorModel) -> list[bytes]:
        if model.layout is None:
            return []
        entry = self._hashes.get(id(request))
        if entry is None or entry[0] is not request:
            entry = (request, {})
            self._hashes[id(request)] = entry
            while len(self._hashes) > 256:
                self._hashes.popitem(last=False)
        by_layout = entry[1]
        key = model.layout.key
        if key not in by_layout:
            by_layout[key] = self._chain(request, model.layout)
        return by_layout[key]

    def _chain(self, request: RouteRequest, layout: Layout) -> list[bytes]:
        """The prompt's reusable blocks' hashes (``forge.gateway.routing.fleet.prompt_hashes``); a session's next
        prompt extends its last one, so only the new blocks are hashed."""
        ids, size = array("i", np.asarray(request.prompt_ids, dtype=np.int32).tobytes()), layout.block_size
        full = (len(ids) - 1) // size
        hashes: list[bytes] = []
        known = self._chains.get(request.session_id) if request.session_id else None
        if known is not None and known[1].get(layout.key):
            previous = known[1][layout.key]
            low, high = 0, min(len(previous), full)      # the longest run of leading blocks equal to the last prompt's
            while low < high:
                middle = (low + high + 1) // 2
                if ids[:middle * size] == known[0][:middle * size]:
                    low = middle
                else:
                    high = middle - 1
            hashes = previous[:low]
        parent = hashes[-1] if hashes else layout.salt
        for start in range(len(hashes) * size, full * size, size):
            parent = block_hash(parent, ids[start:start + size])
            hashes.append(parent)
        if request.session_id:
            chains = known[1] if known is not None and known[0] == ids else {}
            chains[layout.key] = hashes
            self._chains[request.session_id] = (ids, chains)
            self._chains.move_to_end(request.session_id)
            while len(self._chains) > 2048:
                self._chains.popitem(last=False)
        return hashes

    def option(self, request: RouteRequest, view: ActorView, order: int) -> Option:
        model = self.model(view.endpoint.address)
        hashes = self.hashes_for(request, model)
        option = Option(view, model, order, hashes)
        option.local = model.blocks.prefix(hashes)
        size = model.block_size
        tps = max(model.prefill_tps.value, 1.0)
        extra_s = 0.0
        layout = model.layout
        if layout is not None and layout.l3 and option.local < len(hashes):
            missing_s = (len(hashes) - option.local) * size / tps
            if missing_s > model.lookup_s.value:
                extra_s += model.lookup_s.value
                in_l3 = self.l3.blocks.prefix(hashes)
                per_block_s = layout.block_bytes / max(model.fetch_bps.value, 1.0)
                if in_l3 > option.local and per_block_s < size / tps:
                    option.fetch = in_l3 - option.local
                    extra_s += option.fetch * per_block_s
        option.compute_tokens = max(1, len(request.prompt_ids) - (option.local + option.fetch) * size)
        if layout is not None and layout.num_blocks:
            added = len(hashes) - leading(hashes, model.live.__contains__)
            option.evicts = max(0, min(added, len(model.live) + added - layout.num_blocks))
        queue_s = model.pending_tokens / tps
        slots = layout.max_running if layout else 64
        overflow = view.in_flight + 1 - slots
        if overflow > 0:
            queue_s += overflow * model.service_s.value / slots
        if view.in_flight > len(model.pending):
            queue_s += 0.5 * model.step_s.value          # a decode step is probably running
        option.raw_s = queue_s + option.compute_tokens / tps + extra_s
        option.estimate_s = option.raw_s * model.calibration.value
        return option

    def overloaded(self, option: Option, options: list[Option]) -> bool:
        total = sum(o.in_flight for o in options) + 1
        return option.in_flight + 1 > max(self.min_cap, self.share_cap * total / len(options))

    def preferred(self, table: OrderedDict[str, str], key: str, options: list[Option], best: Option
                  ) -> Option | None:
        """The remembered actor for ``key`` if it is a candidate, not overloaded and close enough to the best."""
        address = table.get(key) if key else None
        home = next((o for o in options if o.address == address), None)
        if home is None or self.overloaded(home, options):
            return None
        if home.estimate_s > best.estimate_s * (1 + self.prefer_slack) + 0.002:
            return None
        return home

    def _commit(self, request: RouteRequest, chosen: Option) -> None:
        model = chosen.model
        model.blocks.add(chosen.hashes, self.clock())   # predicted: it will compute, fetch or reuse them now
        model.pending[id(request)] = Pending(chosen.compute_tokens, chosen.estimate_s, chosen.raw_s)
        model.active_blocks += len(chosen.hashes) + 1
        self._started[(id(request), chosen.address)] = (self.clock(), len(chosen.hashes) + 1)
        if request.session_id:
            ended = self.ended_at.pop(request.session_id, None)
            if ended is not None:
                self.gaps.add(self.clock() - ended)
            self.calls_of[request.session_id] = self.calls_of.get(request.session_id, 0) + 1
            self.calls_of.move_to_end(request.session_id)
            while len(self.calls_of) > self.max_remembered:
                self.calls_of.popitem(last=False)
            previous = self._homed.pop(request.session_id, None)
            if previous is not None:
                previous[0].hold(previous[1], -1)
            model.hold(chosen.hashes, 1)
            self._homed[request.session_id] = (model, chosen.hashes)
            while len(self._homed) > min(self.max_remembered, MAX_FOOTPRINTS):
                _, (old, hashes) = self._homed.popitem(last=False)
                old.hold(hashes, -1)
        for table, key in ((self.homes, request.session_id if self.session_affinity else ""),
                           (self.groups, request.group_id)):
            if key:
                table[key] = chosen.address
                table.move_to_end(key)
                while len(table) > self.max_remembered:
                    table.popitem(last=False)

    # ------------------------------------------------------------------ KV events

    def apply(self, address: str, answer: router_pb2.KVEvents) -> None:
        """One poll's answer from ``address`` (also how tests and the simulator feed the router)."""
        model = self.models.get(address)
        if model is None:
            return
        model.apply(answer, self.clock())
        self.l3.observe(answer)

    async def start(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        """Poll every actor's KV events on the running loop (actors need a ``channel``: an aio gRPC channel)."""
        self._metadata = metadata
        self._task = asyncio.create_task(self._poll_forever(), name="kv-events")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _poll_forever(self) -> None:
        while True:                             # the actors of this round: the list may change during it
            await asyncio.gather(*(self._poll(view) for view in list(self.actors)), return_exceptions=True)
            await asyncio.sleep(self.poll_interval_s)

    async def _poll(self, view: ActorView) -> None:
        address = view.endpoint.address
        channel = getattr(view, "channel", None)
        if channel is None or self.clock() < self._retry_at.get(address, 0.0):
            return
        if not any(v is view for v in self.actors):     # removed since the round began
            return
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = router_pb2_grpc.KVEventSourceStub(channel)
        model = self.model(address)
        request = router_pb2.PollKVEventsRequest(epoch=model.epoch, after=model.sequence)
        try:
            answer = await stub.PollKVEvents(request, timeout=2.0, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            if self.models.get(address) is not model:   # removed while the poll ran
                return
            unsupported = exc.code() == grpc.StatusCode.UNIMPLEMENTED
            if unsupported and model.events_supported:
                log.info("actor %s serves no KV events: routing it without its cache contents", address)
            model.events_supported = not unsupported
            self._retry_at[address] = self.clock() + (self.unsupported_retry_s if unsupported else self.failed_retry_s)
            return
        if self.models.get(address) is not model:       # removed (or replaced) while the poll ran
            return
        model.events_supported = True
        self.apply(address, answer)

    # ------------------------------------------------------------------ figures

    def gauges(self) -> dict[str, float]:
        figures = {f"router_decisions/{reason}": float(n) for reason, n in self.decisions.items()}
        figures.update({
            "router_decisions": float(sum(self.decisions.values())),
            "router_ttft_observed": float(self.observed),
            "router_ttft_error_ms": self.error_s.value * 1e3,          # estimated - actual (EWMA)
            "router_ttft_abs_error_ms": self.abs_error_s.value * 1e3,
            "router_ttft_rel_error": self.rel_error.value,
            "router_l3_blocks_known": float(len(self.l3.blocks)),
        })
        for address, model in self.models.items():
            figures[f"router_cached_blocks/{address}"] = float(len(model.blocks))
            figures[f"router_prefill_tps/{address}"] = model.prefill_tps.value
            figures[f"router_pending_tokens/{address}"] = float(model.pending_tokens)
            figures[f"router_calibration/{address}"] = model.calibration.value
            figures[f"router_live_blocks/{address}"] = float(len(model.live))
            figures[f"router_kv_events/{address}"] = float(model.events_supported)     # 0: routed by load alone
        return figures


def best_by(options: list[Option], key: Callable[[Option], float]) -> Option:
    """The minimum of ``key``; ties go to the fewest calls in flight, then round-robin."""
    return min(options, key=lambda o: (key(o), o.in_flight, o.order))
