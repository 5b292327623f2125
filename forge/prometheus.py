"""Prometheus metrics from a service's Stats report: the figures a scrape returns are read at scrape time from the
same function that answers the service's Stats RPC, so ``/metrics`` and ``forge top`` never disagree.

``report_metrics`` turns one ``StatsReport`` into metric families (names and labels in docs/telemetry.md),
``StatsCollector`` is a prometheus-client collector over a report function, and ``MetricsServer`` serves
``GET /metrics`` from a thread of its own for the services that speak only gRPC (the gateway serves it on its HTTP
port instead). With API keys, a scrape needs one (``Authorization: Bearer KEY``), as the service's RPCs do.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from forge.rpc.auth import matches_any
from forge.rpc.server import format_address
from forge.v1 import common_pb2

log = logging.getLogger(__name__)

PREFIX = "forge"
PATH = "/metrics"
Report = Callable[[], common_pb2.StatsReport]

# A gauge named BASE/PART (one per actor, reason or domain) is one metric BASE with PART as this label.
PART_LABELS = {"router_decisions": "reason", "reward": "domain", "sessions": "domain"}
PER_ACTOR_PREFIXES = ("actor_", "router_")
OTHER_PART_LABEL = "key"
IDENTITY_LABELS = ("service", "instance")
DEVICE_LABELS = ("gpu", "gpu_name")

_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(*parts: str) -> str:
    """``forge_`` + the parts joined by ``_``, with every character Prometheus does not allow in a name as ``_``."""
    return _NOT_IN_NAME.sub("_", "_".join((PREFIX, *parts)))


def label_name(name: str) -> str:
    """``name`` as a Prometheus label name (no leading ``_``: names starting with ``__`` are Prometheus's own)."""
    cleaned = _NOT_IN_NAME.sub("_", name).lstrip("_") or "label"
    return "l_" + cleaned if cleaned[0].isdigit() else cleaned


def part_label(base: str) -> str:
    """The label that carries PART of a gauge BASE/PART."""
    if base in PART_LABELS:
        return PART_LABELS[base]
    return "actor" if base.startswith(PER_ACTOR_PREFIXES) else OTHER_PART_LABEL


class _Families:
    """Metric families by name, each sample once (two gauges whose names clean up alike: the first wins)."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}
        self._seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def add(self, name: str, documentation: str, labels: dict[str, str], value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        if key in self._seen:
            return
        self._seen.add(key)
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = Metric(name, documentation, "gauge")
        family.add_sample(name, labels, float(value))


def _numeric_fields(message: Any, skip: Iterable[str] = ()) -> Iterator[tuple[str, float]]:
    skipped = set(skip)
    for field in message.DESCRIPTOR.fields:
        if field.name in skipped or field.type == field.TYPE_STRING:
            continue
        yield field.name, float(getattr(message, field.name))


def report_metrics(report: common_pb2.StatsReport) -> list[Metric]:
    """The metric families of one Stats report: every gauge as ``forge_<service>_<gauge>``, the uptime, an info
    metric with the version and descriptive labels, host figures and one series per GPU; each with the report's
    service and instance as labels."""
    service = report.service or "service"
    identity = {"service": report.service, "instance": report.instance}
    out = _Families()
    for gauge in sorted(report.gauges):
        base, slash, part = gauge.partition("/")
        labels = dict(identity)
        if slash:
            labels[part_label(base)] = part
        shown = f"{base}/<{part_label(base)}>" if slash else gauge
        out.add(metric_name(service, base), f"The {service}'s Stats gauge {shown}.", labels, report.gauges[gauge])
    out.add(metric_name("uptime_seconds"), "Seconds since the service started.", identity, report.uptime_s)
    info = {label_name(k): v for k, v in sorted(report.labels.items())
            if label_name(k) not in (*IDENTITY_LABELS, "version")}
    out.add(metric_name("info"), "The service's version and descriptive labels (always 1).",
            {**identity, "version": report.version, **info}, 1.0)
    for field, value in _numeric_fields(report.host):
        out.add(metric_name("host", field), f"HostStats.{field} of the service's host.", identity, value)
    for device in report.devices:
        labels = {**identity, "gpu": str(device.index), "gpu_name": device.name}
        for field, value in _numeric_fields(device, skip=("index",)):
            out.add(metric_name("gpu", field), f"DeviceStats.{field} of a GPU of the service's host.", labels, value)
    return list(out.families.values())


class StatsCollector(Collector):
    """Collects ``report()`` at every scrape."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def collect(self) -> Iterable[Metric]:
        return report_metrics(self.report())


def stats_registry(report: Report) -> CollectorRegistry:
    """A registry of its own holding only the service's Stats figures (not this library's process defaults)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(report))
    return registry


def request_key(authorization: str | None, api_key_header: str | None) -> str | None:
    """The key an HTTP request presents: ``Authorization: Bearer KEY``, else ``X-Api-Key``."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip() or None
    return (api_key_header or "").strip() or None


def _plain(start_response: Callable, status: str, text: str, headers: Sequence[tuple[str, str]] = ()) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers])
    return [text.encode()]


def metrics_app(registry: CollectorRegistry, api_keys: Sequence[str] = ()) -> Callable:
    """A WSGI app serving ``registry`` at ``/metrics`` only, behind ``api_keys`` when there are any."""
    serve = make_wsgi_app(registry)
    keys = tuple(k for k in api_keys if k)

    def app(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            return _plain(start_response, "404 Not Found", f"no route {environ.get('PATH_INFO')}; metrics are at "
                                                             f"{PATH}\n")
        if keys:
            key = request_key(environ.get("HTTP_AUTHORIZATION"), environ.get("HTTP_X_API_KEY"))
            if not key or not matches_any(key, keys):
                reason = "missing API key" if not key else "invalid API key"
                return _plain(start_response, "401 Unauthorized", reason + "\n",
                              [("WWW-Authenticate", 'Bearer realm="forge"')])
        return serve(environ, start_response)

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s", format % args)


def _server_class(host: str) -> type[WSGIServer]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True             # a stuck scraper does not hold up the service's exit

    return Server


class MetricsServer:
    """``GET /metrics`` of ``registry`` on ``host:port`` (0: any free port), served from a thread of its own."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, api_keys: Sequence[str] = ()) -> None:
        bind = host.strip("[]")
        try:
            self._httpd = make_server(bind, port, metrics_app(registry, api_keys), _server_class(bind),
                                      handler_class=_QuietHandler)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {format_address(bind, port)}: {exc.strerror or exc}") from None
        self.port = self._httpd.server_port
        self.url = f"http://{format_address(bind, self.port)}{PATH}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        log.info("serving Prometheus metrics on %s%s", self.url, " (API key required)" if api_keys else "")

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(report: Report, host: str, port: int | None, api_keys: Sequence[str] = ()) -> MetricsServer | None:
    """A started ``MetricsServer`` for ``report`` on ``port``, or None when ``port`` is None (metrics off)."""
    if port is None:
        return None
    return MetricsServer(stats_registry(report), host, port, api_keys)
