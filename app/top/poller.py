"""Polls the Stats RPC of every target concurrently with a short deadline and keeps each service's state: up with
its latest report and a short history, or down with the reason and since when."""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from forge.app.registry import stats_method
from forge.app.top.discovery import KINDS, Target
from forge.rpc import connect
from forge.v1 import common_pb2


@dataclass
class ServiceState:
    """What is known of one service: ``status`` is "up", "down" or "unknown" (not polled yet)."""

    target: Target
    kind: str = ""                  # the kind whose Stats RPC this service answers ("" until known)
    status: str = "unknown"
    since: float = 0.0              # when the status last changed (unix seconds)
    reason: str = ""                # why it is down
    last_seen: float = 0.0          # the last successful poll
    latency_s: float = 0.0          # of the last successful Stats call
    report: common_pb2.StatsReport | None = None
    history: deque[tuple[float, dict[str, float]]] = field(default_factory=lambda: deque(maxlen=120))

    @property
    def name(self) -> str:
        return self.target.name

    def series(self, gauge: str, per: str = "") -> list[float]:
        """The kept values of ``gauge``; with ``per``, the last one for each distinct value of that gauge."""
        if not per:
            return [gauges[gauge] for _, gauges in self.history if gauge in gauges]
        last: dict[float, float] = {}
        for _, gauges in self.history:
            if gauge in gauges and per in gauges:
                last.pop(gauges[per], None)
                last[gauges[per]] = gauges[gauge]
        return list(last.values())

    def rate(self, gauge: str) -> float | None:
        """Per-second change of a cumulative gauge over the kept history (None with fewer than two samples)."""
        points = [(t, g[gauge]) for t, g in self.history if gauge in g]
        if len(points) < 2 or points[-1][0] <= points[0][0]:
            return None
        return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def _mark_done(done_at: dict[int, float], index: int, _future: object) -> None:
    done_at[index] = time.perf_counter()


def _code(error: Exception) -> grpc.StatusCode | None:
    return error.code() if isinstance(error, grpc.RpcError) and hasattr(error, "code") else None


def _reason(error: Exception) -> str:
    """``CODE: cause``, e.g. "UNAVAILABLE: Connection refused" (gRPC's connection errors keep their last cause)."""
    code = _code(error)
    details = ((error.details() if isinstance(error, grpc.RpcError) and hasattr(error, "details") else "")
               or "").strip()
    first = details.splitlines()[0] if details else ""
    if "last error:" in first:
        first = first.rsplit(": ", 1)[-1]
    if code is None:
        first = first or f"{type(error).__name__}: {error}"
    text = f"{code.name}: {first}" if code and first else (code.name if code else first)
    return text if len(text) <= 160 else text[:157] + "..."


class Poller:
    """Polls ``targets()`` (called each round, so services may come and go) and keeps their states by name."""

    def __init__(self, targets: Callable[[], Iterable[Target]], api_key: str | None = None, timeout_s: float = 1.0,
                 history: int = 120, clock: Callable[[], float] = time.time) -> None:
        self.targets = targets
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.history = history
        self.clock = clock
        self.states: dict[str, ServiceState] = {}
        self._channels: dict[tuple[str, str | None], grpc.Channel] = {}

    def _channel(self, target: Target) -> grpc.Channel:
        key = (target.address, target.api_key or self.api_key)
        if key not in self._channels:
            self._channels[key] = connect(target.address, key[1])
        return self._channels[key]

    def _drop_channel(self, target: Target) -> None:
        channel = self._channels.pop((target.address, target.api_key or self.api_key), None)
        if channel is not None:
            channel.close()

    def _sync_targets(self) -> list[ServiceState]:
        current = {t.name: t for t in self.targets()}
        for name in set(self.states) - set(current):
            self._drop_channel(self.states.pop(name).target)
        for name, target in current.items():
            state = self.states.get(name)
            if state is None:
                self.states[name] = ServiceState(target, kind=target.kind,
                                                 history=deque(maxlen=self.history))
            elif state.target != target:       # restarted elsewhere, or told its kind: keep the history
                self._drop_channel(state.target)
                state.target = target
                state.kind = target.kind or state.kind
        return [self.states[name] for name in current]

    def poll(self) -> list[ServiceState]:
        """One round: every service's Stats at once, each within ``timeout_s``. Returns the states in target order."""
        states = self._sync_targets()
        request = common_pb2.StatsRequest()
        calls = []
        done_at: dict[int, float] = {}
        for state in states:
            channel = self._channel(state.target)
            kinds = [state.kind] if state.kind else list(KINDS)
            for kind in kinds:
                method = channel.unary_unary(stats_method(kind),
                                             request_serializer=common_pb2.StatsRequest.SerializeToString,
                                             response_deserializer=common_pb2.StatsReport.FromString)
                started = time.perf_counter()
                future = method.future(request, timeout=self.timeout_s)
                future.add_done_callback(functools.partial(_mark_done, done_at, len(calls)))
                calls.append((state, kind, started, future))
        outcomes: dict[str, list[tuple[str, float, common_pb2.StatsReport | Exception]]] = {}
        for index, (state, kind, started, future) in enumerate(calls):
            try:
                result: common_pb2.StatsReport | Exception = future.result()
            except Exception as error:    # grpc.RpcError mostly; anything else (a bad answer) is a failure too
                result = error
            latency = done_at.get(index, time.perf_counter()) - started
            outcomes.setdefault(state.name, []).append((kind, latency, result))
        for state in states:
            self._record(state, outcomes.get(state.name, []))
        return states

    def _record(self, state: ServiceState, outcomes: list) -> None:
        now = self.clock()
        answered = [(kind, latency, r) for kind, latency, r in outcomes if isinstance(r, common_pb2.StatsReport)]
        if answered:
            kind, latency, report = answered[0]
            state.kind = kind
            if state.status != "up":
                state.status, state.since = "up", now
            state.reason, state.last_seen, state.latency_s, state.report = "", now, latency, report
            state.history.append((now, dict(report.gauges)))
            return
        errors = [r for _, _, r in outcomes if isinstance(r, Exception)]
        real = [e for e in errors if _code(e) != grpc.StatusCode.UNIMPLEMENTED]
        if real:
            reason = _reason(real[0])
        elif errors:        # reachable, but not (or no longer) this kind of service: ask every kind next round
            reason = f"UNIMPLEMENTED: no Forge Stats service{' of kind ' + state.kind if state.kind else ''} here"
            state.kind = ""
        else:
            reason = "no answer"
        if state.status != "down":
            state.status, state.since = "down", now
        state.reason = reason
        # a fresh channel next round: a restarted service is seen at once, not after gRPC's reconnect backoff
        self._drop_channel(state.target)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> Poller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
