"""Prometheus metrics of every service: names and labels from a Stats report; the metrics server's key check; each
service as a real process on loopback, its ``/metrics`` scraped and parsed with prometheus-client and compared
with its Stats RPC read right after; a bad ``--metrics-port`` refused in one line with exit status 2."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from forge.prometheus import MetricsServer, metric_name, part_label, report_metrics, stats_registry
from forge.rpc.auth import bearer_metadata
from forge.telemetry import stats_report
from forge.v1 import (
    actor_pb2,
    actor_pb2_grpc,
    cache_pb2,
    cache_pb2_grpc,
    common_pb2,
    gateway_pb2_grpc,
    learner_pb2_grpc,
)

from conftest import free_port, script
from helpers.gateway_procs import start_gateway
from helpers.processes import Service, start_actor, start_cache

KEY = "metrics-test-key"
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str, key: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(url, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def series(report: common_pb2.StatsReport, gauge: str) -> tuple[str, frozenset[tuple[str, str]]]:
    """The series a Stats gauge is exposed as."""
    base, slash, part = gauge.partition("/")
    labels = {"service": report.service, "instance": report.instance}
    if slash:
        labels[part_label(base)] = part
    return metric_name(report.service, base), frozenset(labels.items())


def assert_same(scraped: Samples, report: common_pb2.StatsReport, moving: set[str] = frozenset()) -> None:
    """Every Stats gauge is a series; those that do not move at rest have the very same value."""
    for gauge, value in report.gauges.items():
        key = series(report, gauge)
        assert key in scraped, (gauge, sorted(k for k, _ in scraped))
        if gauge not in moving:
            assert scraped[key] == pytest.approx(value, nan_ok=True), gauge
    ours = {k for k in scraped if k[0].startswith(f"forge_{report.service}_")}
    assert ours == {series(report, gauge) for gauge in report.gauges}
    info = [dict(labels) for name, labels in scraped if name == "forge_info"]
    assert info == [{"service": report.service, "instance": report.instance, "version": report.version,
                     **report.labels}]


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


# ------------------------------------------------------------------------------------- real services


@pytest.fixture(scope="module")
def actor(tmp_path_factory):
    proc = start_actor(tmp_path_factory.mktemp("metrics-actor"), "--metrics-port", "0", "--api-key", KEY,
                       "--threads", "1", name="actor-m")
    with grpc.insecure_channel(proc.address) as channel:
        request = actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3], sampling=common_pb2.SamplingParams(
            temperature=0, max_tokens=4, ignore_eos=True))
        chunks = actor_pb2_grpc.ActorStub(channel).Generate(request, metadata=bearer_metadata(KEY), timeout=60)
        assert sum(len(c.token_ids) for c in chunks) == 4
    yield proc
    assert proc.stop() == 0


def test_actor_metrics_are_its_stats_and_need_its_key(actor):
    url = actor.info["metrics_url"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert httpx.get(url, timeout=30).status_code == 401
    scraped = scrape(url, KEY)
    with grpc.insecure_channel(actor.address) as channel:
        report = actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest(), metadata=bearer_metadata(KEY),
                                                         timeout=30)
    assert report.gauges["tokens"] >= 4 and report.gauges["finished"] == 1
    assert report.instance == actor.info["instance"]
    assert_same(scraped, report, moving={"tokens_per_s", "prefill_tokens_per_s"})


def test_gateway_metrics_on_its_http_port_are_its_stats(actor, tmp_path):
    gateway = start_gateway(tmp_path, [actor.address], tmp_path / "pool", "--actor-api-key", KEY)
    try:
        with httpx.Client(base_url=gateway.http, timeout=60) as http:
            opened = http.post("/v1/sessions", json={})
            assert opened.status_code == 200, opened.text
            sid = opened.json()["session"]["session_id"]
            chat = http.post(f"/s/{sid}/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert chat.status_code == 200, chat.text
            scraped = scrape(f"{gateway.http}/metrics")            # no keys configured: open, like /v1/stats
        with grpc.insecure_channel(gateway.grpc_address) as channel:
            report = gateway_pb2_grpc.GatewayStub(channel).Stats(common_pb2.StatsRequest(), timeout=30)
    finally:
        gateway.stop()
    assert report.gauges["calls"] == 1 and report.gauges["sessions_open"] == 1
    # the scrape itself is an HTTP request, the Stats call a gRPC one; rates and router estimates move with time
    moving = {g for g in report.gauges if g.endswith("_per_s") or g.startswith("router_")}
    assert_same(scraped, report, moving=moving | {"http_requests", "grpc_requests"})
    assert scraped[series(report, f"actor_calls/{actor.address}")] == 1


class PoolServe:
    """``forge pool serve`` with metrics on a free port; its addresses from its first two lines."""

    def __init__(self, path, *args: str) -> None:
        self.proc = subprocess.Popen([script("forge"), "pool", "serve", "--path", str(path), "--port", "0",
                                      "--metrics-port", "0", "--map-size", "16MiB", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first, second = self.proc.stdout.readline(), self.proc.stdout.readline()
        assert first.startswith("serving the pool") and second.startswith("serving Prometheus metrics"), first
        self.address, self.metrics_url = first.split()[-1], second.split()[-1]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.proc.stdout.close()
        return self.proc.returncode


def test_pool_metrics_are_its_stats(tmp_path):
    from forge.pool.client import PoolClient

    pool = PoolServe(tmp_path / "pool", "--api-key", KEY)
    try:
        client = PoolClient(pool.address, api_key=KEY)
        for group in range(3):
            client.open_session(task_id=f"t{group}", group_id=f"g{group}", group_size=1)
        assert httpx.get(pool.metrics_url, timeout=30).status_code == 401
        scraped = scrape(pool.metrics_url, KEY)
        report = client.stats_report()
        client.close()
    finally:
        assert pool.stop() == 0
    assert report.gauges["sessions_open"] == 3 and report.labels["path"] == str(tmp_path / "pool")
    moving = {g for g in report.gauges if g.endswith("_per_s")} | {"head_age_s"}
    assert_same(scraped, report, moving=moving)


def test_cache_metrics_are_its_stats(tmp_path):
    cache = start_cache(tmp_path, "cache", "--metrics-port", "0")
    try:
        with grpc.insecure_channel(cache.address) as channel:
            stub = cache_pb2_grpc.CacheStub(channel)
            stub.Lookup(cache_pb2.LookupRequest(block_hashes=[bytes([i]) * 16 for i in range(5)]), timeout=30)
            scraped = scrape(cache.info["metrics_url"])
            report = stub.Stats(common_pb2.StatsRequest(), timeout=30)
    finally:
        assert cache.stop() == 0
    assert report.gauges["lookups"] == 1 and report.gauges["lookup_blocks"] == 5
    assert_same(scraped, report, moving={"puts_per_s", "gets_per_s"})


def test_learner_metrics_are_its_stats(tmp_path):
    from forge.actors.config import EngineConfig
    from forge.actors.engine.engine import TorchEngine
    from forge.builtin import load_model
    from forge.pool import Pool

    from helpers.rollouts import fill_pool

    policy, _ = load_model("tiny")
    engine = TorchEngine(policy, EngineConfig(kv_cache_bytes=4 * 2**20, block_size=8))
    pool = Pool(tmp_path / "pool")
    fill_pool(pool, engine, groups=2, group_size=2, max_tokens=4, domains=("math", "qa"))
    engine.close()
    pool.close()
    learner = Service("learner", "forge-learner", ["--pool", str(tmp_path / "pool"), "--run-dir",
                                                   str(tmp_path / "run"), "--no-publish", "--batch-groups", "1",
                                                   "--window", "2", "--max-wait", "0.5", "--metrics-port", "0"],
                      tmp_path, timeout_s=120)
    try:
        with grpc.insecure_channel(learner.address) as channel:
            stub = learner_pb2_grpc.LearnerStub(channel)
            deadline = time.monotonic() + 240
            while stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges.get("step", 0) < 2:   # both groups
                assert time.monotonic() < deadline and learner.proc.poll() is None, learner.log_text()[-2000:]
                time.sleep(0.1)
            scraped = scrape(learner.info["metrics_url"])
            report = stub.Stats(common_pb2.StatsRequest(), timeout=30)
    finally:
        assert learner.stop() == 0
    assert report.gauges["step"] == 2 and {"reward/math", "reward/qa"} & set(report.gauges)
    assert_same(scraped, report)


# ------------------------------------------------------------------------------------------ bad ports


COMMANDS = {"actor": ["forge-actor"], "cache": ["forge-cache", "--dir", "{tmp}/blocks"],
            "learner": ["forge-learner", "--pool", "{tmp}/pool", "--create-pool"],
            "pool": ["forge", "pool", "serve", "--path", "{tmp}/pool"]}


@pytest.mark.parametrize("service", sorted(COMMANDS))
def test_a_bad_metrics_port_is_refused_in_one_line_before_anything_loads(service, tmp_path):
    command = [script(COMMANDS[service][0]), *(a.format(tmp=tmp_path) for a in COMMANDS[service][1:])]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        grpc_port = str(free_port())
        cases = {"70000": "70000", str(port): "cannot listen on 127.0.0.1", grpc_port: "is the gRPC --port"}
        for value, told in cases.items():
            result = subprocess.run([*command, "--port", grpc_port, "--metrics-port", value], capture_output=True,
                                    text=True, timeout=120)
            errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
            assert result.returncode == 2 and len(errors) == 1, result.stderr
            assert "--metrics-port" in errors[0] and told in errors[0], result.stderr
            assert "Traceback" not in result.stderr
    assert not (tmp_path / "pool").exists() and not (tmp_path / "blocks").exists()


def test_metrics_are_off_unless_asked(tmp_path):
    from forge.actors.config import ActorConfig
    from forge.cache.config import CacheConfig
    from forge.learner.config import LearnerConfig
    from forge.pool.config import PoolServeConfig

    for config in (ActorConfig, CacheConfig, LearnerConfig, PoolServeConfig):
        assert config.__dataclass_fields__["metrics_port"].default is None
    help_text = subprocess.run([sys.executable, "-m", "forge.cache", "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "--metrics-port" in help_text
