"""``forge top`` against real services on loopback: a forge-actor (ready file) and a Pool service (services.json)
in a run directory; a service that goes down and comes back; API keys; a slow service; the no-GPU path of this
machine; the live loop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from rich.console import Console

from forge import telemetry
from forge.app.top.cli import top
from forge.app.top.discovery import Target, discover
from forge.app.top.poller import Poller
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

from conftest import HELPERS, REPO
from helpers.processes import start_actor


class PoolProcess:
    """``python -m forge.pool`` on ``port`` (0: any), its address read from its first line."""

    def __init__(self, path: Path, port: int = 0, *args: str) -> None:
        self.log = (path.parent / f"{path.name}-{port}.log").open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "forge.pool", "--path", str(path), "--port",
                                      str(port), "--map-size", "16MiB", *args],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("serving the pool"):
            self.stop()
            raise RuntimeError(f"the pool did not start: {line}")
        self.address = line.split()[-1]
        self.port = int(self.address.rsplit(":", 1)[1])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


def services_json(run: Path, *entries: tuple[str, str, str]) -> None:
    (run / "services.json").write_text(json.dumps(
        {"services": [{"name": n, "kind": k, "address": a} for n, k, a in entries]}))


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    pool = PoolProcess(run / "pool")
    try:
        actor = start_actor(run, name="actor-0")
    except Exception:
        pool.stop()
        raise
    services_json(run, ("pool", "pool", pool.address))
    with grpc.insecure_channel(actor.address) as channel:
        request = actor_pb2.GenerateRequest(prompt_ids=[1, 2, 3], sampling=common_pb2.SamplingParams(
            temperature=0, max_tokens=4, ignore_eos=True))
        assert len(list(actor_pb2_grpc.ActorStub(channel).Generate(request, timeout=60))) >= 1
    yield run, actor, pool
    assert actor.stop() == 0
    assert pool.stop() == 0


def once_json(*args: str) -> dict:
    result = CliRunner().invoke(top, [*args, "--once", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_once_json_has_every_service_and_its_figures(system):
    run, actor, pool = system
    data = once_json(str(run))
    services = {s["name"]: s for s in data["services"]}
    assert set(services) == {"pool", "actor-0"} and data["up"] == 2 and data["down"] == 0
    a, p = services["actor-0"], services["pool"]
    assert a["status"] == "up" and a["kind"] == "actor" and a["address"] == actor.address
    assert a["instance"] == actor.info["instance"] and a["labels"]["backend"] == "torch"
    for gauge in ("tokens_per_s", "running", "waiting", "kv_used_frac", "prefix_hit_rate", "spec_acceptance",
                  "weight_version", "preemptions"):
        assert gauge in a["gauges"], gauge
    assert a["gauges"]["finished"] >= 1 and a["gauges"]["tokens"] >= 4
    assert p["status"] == "up" and p["kind"] == "pool" and p["address"] == pool.address
    for gauge in ("queued", "completed", "consumed", "head", "tail", "head_age_s", "appends_per_s"):
        assert gauge in p["gauges"], gauge
    assert p["labels"]["path"] == str(run / "pool")
    assert {"host", "devices", "gpu_processes"} <= set(data["local"])


def test_the_command_line_prints_json_and_exits_0(system):
    run, _, _ = system
    result = subprocess.run([sys.executable, "-m", "forge.app.top", "top", str(run), "--once", "--json", "--no-local"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert sorted(s["status"] for s in data["services"]) == ["up", "up"] and "local" not in data


def test_no_gpu_path_of_this_machine(system):
    run, _, _ = system
    data = once_json(str(run))
    gpus = telemetry.nvml()
    hosts = [s["host"] for s in data["services"]] + [data["local"]["host"]]
    for host in hosts:
        assert host["cpu_count"] >= 1 and host["memory_total_bytes"] > host["memory_used_bytes"] > 0
        assert 0 <= host["cpu_pct"] <= 100
    assert all(s["host"]["process_rss_bytes"] > 0 for s in data["services"])
    console = Console(record=True, width=160)
    with Poller(lambda: discover(run)) as poller:
        from forge.app.top.snapshot import sample_local
        from forge.app.top.view import render

        console.print(render(poller.poll(), sample_local()))
    text = console.export_text()
    if gpus.module is None:                 # this machine (CI, development VM): no GPU or no NVML
        assert gpus.reason and ("NVML" in gpus.reason or "GPU" in gpus.reason or "nvidia-ml-py" in gpus.reason)
        for host in hosts:
            assert host["gpu_available"] is False and host["gpu_unavailable_reason"] == gpus.reason
        assert all(s["devices"] == [] for s in data["services"]) and data["local"]["devices"] == []
        assert "no GPU" in text and gpus.reason in text and "CPU" in text and "host memory" in text
    else:                                    # a GPU host: every service sees the devices through NVML
        count = gpus.module.nvmlDeviceGetCount()
        assert all(len(s["devices"]) == count for s in data["services"]) and len(data["local"]["devices"]) == count
        assert "GPU0" in text


def test_live_view_of_real_services(system):
    run, _, _ = system
    with Poller(lambda: discover(run)) as poller:
        from forge.app.top.view import render

        poller.poll()
        states = poller.poll()
    assert [s.status for s in states] == ["up", "up"] and all(len(s.history) == 2 for s in states)
    console = Console(record=True, width=150)
    console.print(render(states, None, source=str(run), interval_s=1.0))
    text = console.export_text()
    for expected in ("2 up, 0 down", "Actors", "actor-0", "tok/s", "KV", "prefix hit", "spec acc", "weights", "Pool",
                     "queued", "completed", "consumed", "head/tail", "Devices and hosts"):
        assert expected in text, expected

    result = CliRunner().invoke(top, [str(run), "--interval", "0.2", "--count", "3", "--no-local"])
    assert result.exit_code == 0, result.output
    assert "Actors" in result.output and "Pool" in result.output


def test_a_service_that_goes_down_is_shown_down_and_comes_back(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    pool = PoolProcess(run / "pool")
    services_json(run, ("pool", "pool", pool.address))
    poller = Poller(lambda: discover(run), timeout_s=2.0)
    try:
        [state] = poller.poll()
        assert state.status == "up" and state.kind == "pool" and state.report.gauges["tail"] == 0
        up_since = state.since
        assert pool.stop() == 0

        [state] = poller.poll()
        assert state.status == "down" and state.reason.startswith("UNAVAILABLE") and state.since >= up_since
        down_since = state.since
        [state] = poller.poll()
        assert state.status == "down" and state.since == down_since          # since when, not since the last poll
        data = once_json(str(run), "--no-local")
        [shown] = data["services"]
        assert shown["status"] == "down" and shown["reason"].startswith("UNAVAILABLE") and data["down"] == 1

        pool = PoolProcess(run / "pool", pool.port)                          # restarted on the same port
        [state] = poller.poll()
        assert state.status == "up" and state.since > down_since and state.reason == ""
        assert len(state.history) == 2                                        # the history was kept
        assert once_json(str(run), "--no-local")["services"][0]["status"] == "up"

        pool.stop()                                                           # and once more on another port
        pool = PoolProcess(run / "pool")
        services_json(run, ("pool", "pool", pool.address))
        [state] = poller.poll()
        assert state.status == "up" and state.target.address == pool.address and len(state.history) == 3
    finally:
        poller.close()
        pool.stop()


def test_api_key_and_a_service_of_unknown_kind(tmp_path):
    pool = PoolProcess(tmp_path / "pool", 0, "--api-key", "sekret")
    try:
        data = once_json("--address", pool.address, "--no-local")
        [shown] = data["services"]
        assert shown["status"] == "down" and shown["reason"] == "UNAUTHENTICATED: missing API key"
        data = once_json("--address", pool.address, "--api-key", "sekret", "--no-local")
        [shown] = data["services"]
        assert shown["status"] == "up" and shown["kind"] == "pool" and shown["service"] == "pool"
    finally:
        pool.stop()


def test_a_slow_service_misses_its_deadline_and_a_wrong_kind_is_found_out(tmp_path):
    helper = HELPERS / "stats_server.py"
    proc = subprocess.Popen([sys.executable, str(helper), "--port", "0", "--slow-s", "1.5"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        address = proc.stdout.readline().split()[-1]
        with Poller(lambda: [Target("slow", address, "learner")], timeout_s=0.3) as poller:
            started = time.monotonic()
            [state] = poller.poll()
            assert time.monotonic() - started < 1.4
            assert state.status == "down" and state.reason.startswith("DEADLINE_EXCEEDED")
        with Poller(lambda: [Target("misnamed", address, "actor")], timeout_s=5.0) as poller:
            [state] = poller.poll()
            assert state.status == "down" and "UNIMPLEMENTED" in state.reason and state.kind == ""
            [state] = poller.poll()                               # asks every kind, the learner answers
            assert state.status == "up" and state.kind == "learner" and state.report.gauges["step"] == 7
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
