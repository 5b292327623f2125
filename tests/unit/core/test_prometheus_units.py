"""Prometheus metrics from Stats reports: names and labels, a valid exposition whatever the names, and the metrics
server's key check. (Every service as a real process, scraped: integration/test_prometheus.py.)"""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from forge.prometheus import MetricsServer, report_metrics, stats_registry
from forge.telemetry import stats_report

from helpers.metrics import parse, scrape

KEY = "metrics-test-key"
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


# ---------------------------------------------------------------------------------------- names and labels


def test_a_report_becomes_gauges_named_after_its_service_with_its_labels():
    report = stats_report("gateway", "gw-1", time.time() - 5,
                          {"calls": 3, "actor_calls/127.0.0.1:50051": 2, "router_decisions/load": 4,
                           "latency_ms_p50": float("nan"), "odd-name.x": 7},
                          {"model": "tiny", "http_url": "http://127.0.0.1:8000"})
    report.devices.add(index=0, name="H200", utilization_pct=40, memory_used_bytes=2**30)
    got = parse(generate_latest(stats_registry(lambda: report)).decode())
    who = {("service", "gateway"), ("instance", "gw-1")}
    assert got[("forge_gateway_calls", frozenset(who))] == 3
    assert got[("forge_gateway_actor_calls", frozenset(who | {("actor", "127.0.0.1:50051")}))] == 2
    assert got[("forge_gateway_router_decisions", frozenset(who | {("reason", "load")}))] == 4
    assert got[("forge_gateway_odd_name_x", frozenset(who))] == 7
    assert got[("forge_gateway_latency_ms_p50", frozenset(who))] != got[("forge_gateway_latency_ms_p50",
                                                                          frozenset(who))]     # NaN stays NaN
    assert got[("forge_info", frozenset(who | {("version", report.version), ("model", "tiny"),
                                               ("http_url", "http://127.0.0.1:8000")}))] == 1
    assert got[("forge_uptime_seconds", frozenset(who))] == pytest.approx(report.uptime_s)
    assert got[("forge_host_cpu_count", frozenset(who))] == report.host.cpu_count
    gpu = frozenset(who | {("gpu", "0"), ("gpu_name", "H200")})
    assert got[("forge_gpu_utilization_pct", gpu)] == 40 and got[("forge_gpu_memory_used_bytes", gpu)] == 2**30


def test_learner_domains_become_a_label():
    report = stats_report("learner", "learner", time.time(), {"reward_mean": 0.5, "reward/math": 0.25,
                                                              "sessions": 4, "sessions/math": 2})
    got = parse(generate_latest(stats_registry(lambda: report)).decode())
    who = {("service", "learner"), ("instance", "learner")}
    assert got[("forge_learner_reward", frozenset(who | {("domain", "math")}))] == 0.25
    assert got[("forge_learner_sessions", frozenset(who))] == 4
    assert got[("forge_learner_sessions", frozenset(who | {("domain", "math")}))] == 2


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), st.floats(allow_nan=False), max_size=8),
       st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4))
def test_any_gauge_and_label_names_give_a_valid_exposition(gauges, labels):
    report = stats_report("cache", "cache-1", time.time(), gauges, labels)
    families = report_metrics(report)
    text = generate_latest(stats_registry(lambda: report)).decode()
    parsed = list(text_string_to_metric_families(text))
    assert len(parsed) == len(families)
    samples = [s for family in parsed for s in family.samples]
    assert all(NAME.match(s.name) and all(NAME.match(label) and not label.startswith("__") for label in s.labels)
               for s in samples)
    keys = [(s.name, frozenset(s.labels.items())) for s in samples]
    assert len(keys) == len(set(keys))                    # names that clean up alike: one series, not two


# ------------------------------------------------------------------------------------------ the server


def test_the_metrics_server_needs_a_key_when_it_has_keys():
    report = stats_report("pool", "pool-1", time.time(), {"tail": 5})
    with MetricsServer(stats_registry(lambda: report), "127.0.0.1", 0, [KEY]) as server:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        missing, wrong = httpx.get(server.url), httpx.get(server.url, headers={"Authorization": "Bearer nope"})
        assert (missing.status_code, missing.text.strip()) == (401, "missing API key")
        assert (wrong.status_code, wrong.text.strip()) == (401, "invalid API key")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert scrape(server.url, KEY)[("forge_pool_tail", frozenset({("service", "pool"),
                                                                       ("instance", "pool-1")}))] == 5
        assert httpx.get(server.url, headers={"X-Api-Key": KEY}).status_code == 200
        assert httpx.get(server.url.replace("/metrics", "/other"), headers={"X-Api-Key": KEY}).status_code == 404
        assert httpx.post(server.url, headers={"X-Api-Key": KEY}).status_code == 405
    with MetricsServer(stats_registry(lambda: report), "127.0.0.1", 0) as server:
        assert httpx.get(server.url).status_code == 200


def test_a_taken_port_is_an_os_error_that_names_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            MetricsServer(stats_registry(lambda: stats_report("pool", "p", time.time(), {})), "127.0.0.1", port)
