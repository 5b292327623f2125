"""Prometheus metrics of every service as a real process on loopback: its ``/metrics`` scraped and parsed with
prometheus-client and compared with its Stats RPC read right after; a bad ``--metrics-port`` refused in one line
with exit status 2; metrics off unless asked. (Names, labels and the metrics server: unit/test_prometheus.py.)"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import grpc
import httpx
import pytest

from forge.rpc.auth import bearer_metadata
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
from helpers.metrics import assert_same, scrape, series
from helpers.processes import Service, start_actor, start_cache
from helpers.waiting import wait_for

KEY = "metrics-test-key"


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
    from forge.checkpoints import load_model
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
            wait_for(lambda: stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges.get("step", 0) >= 2,
                     "the learner's second step (both groups)", 240, watched=[learner])
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
