"""``forge top`` without services: discovery of a run directory, number forms, the JSON snapshot and the rendered
frame of made-up reports (GPU and no-GPU hosts, unknown services, services that are down)."""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.console import Console

from forge import telemetry
from forge.app.top import fmt
from forge.app.top.cli import finite, top
from forge.app.top.discovery import Target, discover, parse_address
from forge.app.top.poller import ServiceState
from forge.app.top.snapshot import LocalMachine, snapshot
from forge.app.top.view import render
from forge.v1 import common_pb2


def test_parse_address_forms():
    assert parse_address("actor=127.0.0.1:5000") == Target("actor@127.0.0.1:5000", "127.0.0.1:5000", "actor")
    assert parse_address("a0:actor=localhost:5000") == Target("a0", "localhost:5000", "actor")
    assert parse_address("127.0.0.1:5001") == Target("127.0.0.1:5001", "127.0.0.1:5001", "")
    assert parse_address("pool=[::1]:5002").address == "[::1]:5002"
    for bad in ("actor=nohost", "toaster=127.0.0.1:1", "actor=127.0.0.1:99999", ""):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_discover_reads_services_json_and_ready_files(tmp_path):
    (tmp_path / "services.json").write_text(json.dumps({"services": [
        {"name": "gw", "kind": "gateway", "address": "127.0.0.1:7001"},
        {"name": "broken", "kind": "actor", "address": "nowhere"},
        {"kind": "router", "address": "127.0.0.1:7002"}]}))
    (tmp_path / "actor-0.json").write_text(json.dumps({"address": "127.0.0.1:7003", "instance": "actor-7003",
                                                       "pid": 1}))
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "ready.json").write_text(json.dumps({"address": "127.0.0.1:7004", "pid": 2,
                                                                 "weights_fetch": "tcp://127.0.0.1:5701"}))
    (tmp_path / "gateway.json").write_text(json.dumps({"grpc_address": "127.0.0.1:7001", "base_url": "x"}))
    (tmp_path / "gw2.json").write_text(json.dumps({"grpc_address": "127.0.0.1:7005", "base_url": "x"}))
    (tmp_path / "half.json").write_text('{"address": "127.0.0.1:70')                  # being written
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))               # not a ready file
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "metrics.jsonl").write_text('{"address": "127.0.0.1:7006"}\n')
    found = discover(tmp_path, [parse_address("cache=127.0.0.1:7007")])
    assert [(t.name, t.kind, t.address) for t in found] == [
        ("cache@127.0.0.1:7007", "cache", "127.0.0.1:7007"),
        ("gw", "gateway", "127.0.0.1:7001"),
        ("router-2", "router", "127.0.0.1:7002"),
        ("actor-0", "actor", "127.0.0.1:7003"),
        ("gw2", "gateway", "127.0.0.1:7005"),                 # gateway.json repeats gw's address: left out
        ("learner/ready", "learner", "127.0.0.1:7004"),
    ]
    assert discover(tmp_path / "missing") == [] and discover(None) == []


def test_number_forms():
    assert fmt.number(3.0) == "3" and fmt.number(0.12345) == "0.123" and fmt.number(12345.0) == "12.3k"
    assert fmt.number(float("nan")) == "-" and fmt.number(None) == "-" and fmt.number(250.4) == "250"
    assert fmt.percent(0.456) == "46%" and fmt.size(3 * 2**30) == "3.0 GiB" and fmt.size(12) == "12 B"
    assert fmt.used_of(2**30, 8 * 2**30) == "1.0/8.0 GiB"
    assert fmt.duration(5) == "5.0s" and fmt.duration(125) == "2m05s" and fmt.duration(7300) == "2h01m"
    assert fmt.sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == fmt.BARS and fmt.sparkline([]) == ""
    assert fmt.sparkline([2, 2]) == fmt.BARS[4] * 2
    assert finite({"a": [float("inf"), 1.5], "b": float("nan")}) == {"a": [None, 1.5], "b": None}


def _host(gpu: bool) -> common_pb2.HostStats:
    return common_pb2.HostStats(cpu_pct=42.0, cpu_count=16, memory_used_bytes=3 * 2**30,
                                memory_total_bytes=64 * 2**30, process_rss_bytes=512 * 2**20, gpu_available=gpu,
                                gpu_unavailable_reason="" if gpu else "NVML unavailable: no library")


def _state(name: str, kind: str, gauges: dict[str, float], devices=(), status: str = "up", **extra) -> ServiceState:
    report = common_pb2.StatsReport(service=kind, instance=f"{name}-inst", gauges=gauges, devices=list(devices),
                                    host=_host(bool(devices)))
    state = ServiceState(Target(name, f"127.0.0.1:{abs(hash(name)) % 60000 + 1000}", kind), kind=kind,
                         status=status, since=1000.0, report=report, history=deque(maxlen=10), **extra)
    for t in range(3):
        state.history.append((1000.0 + t, {k: v * (t + 1) / 3 for k, v in gauges.items()}))
    return state


H200 = common_pb2.DeviceStats(index=0, name="NVIDIA H200", utilization_pct=87, memory_used_bytes=40 * 2**30,
                              memory_total_bytes=141 * 2**30, power_w=312, power_limit_w=700, temperature_c=55,
                              sm_clock_mhz=1980, memory_clock_mhz=3201, process_memory_bytes=38 * 2**30)


@pytest.fixture
def states():
    return [
        _state("actor-0", "actor", {"tokens_per_s": 1234.5, "running": 7, "waiting": 2, "kv_used_frac": 0.61,
                                    "prefix_hit_rate": 0.42, "spec_acceptance": 0.73, "weight_version": 12,
                                    "preemptions": 1}, devices=[H200]),
        _state("actor-1", "actor", {"tokens_per_s": 99.0, "running": 1, "waiting": 0}),
        _state("gateway", "gateway", {"sessions_open": 32, "calls_per_s": 17.5, "latency_ms_p50": 120.0,
                                      "latency_ms_p99": 900.0}),
        _state("pool", "pool", {"queued": 5, "completed": 3, "consumed": 40, "head": 41, "tail": 49,
                                "head_age_s": 12.0}),
        _state("learner", "learner", {"step": 9, "loss": 0.0123, "reward_mean": 0.5, "reward/math": 0.75,
                                      "reward/code": 0.25, "tokens_per_s": 5000, "staleness_mean": 1.5,
                                      "tree_compression": 2.5}, devices=[H200]),
        _state("cache", "cache", {"blocks": 100, "hit_rate": 0.3}),
        _state("mystery", "weather", {"temperature": 21.5, "peer/[::1]:5000": 1}),
        _state("actor-2", "actor", {}, status="down", reason="UNAVAILABLE: Connection refused"),
    ]


def test_render_shows_every_section_and_only_reported_gauges(states):
    console = Console(record=True, width=200)
    local = LocalMachine(host=_host(False), devices=[], hostname="box")
    console.print(render(states, local, source="runs/demo", interval_s=1.0, now=1010.0))
    text = console.export_text()
    for expected in ("7 up, 1 down", "Actors", "actor-0", "1234", "61%", "42%", "73%", "v12", "GPU0 87%",
                     "Gateway", "17.5", "120/900", "Pool", "41/49", "Learner", "math 0.75", "code 0.25", "2.5",
                     "Cache", "hit_rate 0.3", "weather", "temperature 21.5", "peer/[::1]:5000 1", "Devices and hosts", "NVIDIA H200",
                     "312/700 W", "40.0/141.0 GiB", "38.0 GiB", "no GPU", "NVML unavailable: no library",
                     "local box", "Down", "actor-2", "UNAVAILABLE: Connection refused", "(10s ago)", fmt.BARS[-1]):
        assert expected in text, expected
    assert "ttft" not in text and "spec acc" in text       # gauges nobody reports get no column


def test_render_shows_the_prefill_and_decode_pools_apart():
    prefill = _state("actor-prefill-0", "actor", {"tokens_per_s": 5.0, "l3_handovers": 31})
    prefill.report.labels["role"] = "prefill"
    decode = _state("actor-0", "actor", {"tokens_per_s": 700.0})
    decode.report.labels["role"] = "decode"
    console = Console(record=True, width=200)
    console.print(render([decode, prefill, _state("actor-9", "actor", {"tokens_per_s": 1.0})], now=1010.0))
    text = console.export_text()
    assert text.index("Actors") < text.index("actor-9") < text.index("Prefill actors") < text.index(
        "handovers") < text.index("actor-prefill-0") < text.index("Decode actors") < text.index("actor-0 ")
    assert "31" in text and text.count("handovers") == 1


def test_render_fits_a_narrow_terminal(states):
    console = Console(record=True, width=80)
    console.print(render(states, None, now=1010.0, width=80))
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in "\n".join(lines) and "tok/s" in lines[2] + lines[3] + lines[4]


def test_render_without_services_says_how_to_find_them():
    console = Console(record=True, width=120)
    console.print(render([], None))
    assert "no services found" in console.export_text()


def test_snapshot_is_plain_json(states):
    local = LocalMachine(host=_host(True), devices=[H200], hostname="box")
    data = json.loads(json.dumps(finite(snapshot(states, local))))
    assert data["up"] == 7 and data["down"] == 1
    by_name = {s["name"]: s for s in data["services"]}
    assert by_name["actor-0"]["devices"][0]["memory_used_bytes"] == 40 * 2**30       # numbers, not strings
    assert by_name["actor-0"]["gauges"]["running"] == 7
    assert by_name["actor-1"]["host"]["gpu_unavailable_reason"] == "NVML unavailable: no library"
    assert by_name["actor-2"]["status"] == "down" and by_name["actor-2"]["reason"].startswith("UNAVAILABLE")
    assert by_name["actor-2"]["last_report"]["service"] == "actor"
    assert data["local"]["devices"][0]["name"] == "NVIDIA H200" and "process_memory_bytes" not in \
        data["local"]["devices"][0]


def test_top_rejects_bad_arguments(tmp_path):
    result = CliRunner().invoke(top, ["--address", "actor=nowhere"])
    assert result.exit_code == 2 and "expected [NAME:]KIND=HOST:PORT" in result.output
    result = CliRunner().invoke(top, [str(tmp_path / "missing"), "--once"])
    assert result.exit_code == 2 and "is not a directory" in result.output
    result = CliRunner().invoke(top, ["--no-local", "--once"])
    assert result.exit_code == 2 and "nothing to show" in result.output


class _FakeNvml:
    """Two devices; this process holds 1 GiB on device 0 (reported twice: compute and graphics)."""

    class Proc:
        def __init__(self, pid: int, memory: int | None) -> None:
            self.pid, self.usedGpuMemory = pid, memory

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:
        return [self.Proc(os.getpid(), 2**30), self.Proc(1, None)] if handle == 0 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list:
        if handle == 1:
            raise RuntimeError("not supported")
        return [self.Proc(os.getpid(), 2**20)]


def test_gpu_processes_and_their_table(monkeypatch):
    monkeypatch.setattr(telemetry, "_nvml", SimpleNamespace(module=_FakeNvml(), reason=""))
    processes = telemetry.gpu_processes()
    command = Path("/proc/self/comm").read_text().strip()
    assert processes == [telemetry.GpuProcess(0, os.getpid(), 2**30, command),
                         telemetry.GpuProcess(0, 1, 0, Path("/proc/1/comm").read_text().strip())]
    console = Console(record=True, width=120)
    console.print(render([], LocalMachine(host=_host(True), devices=[H200], processes=processes, hostname="box")))
    text = console.export_text()
    assert "GPU processes (local)" in text and str(os.getpid()) in text and "1.0 GiB" in text
    monkeypatch.setattr(telemetry, "_nvml", SimpleNamespace(module=None, reason="no GPU"))
    assert telemetry.gpu_processes() == []


def test_a_services_gpu_memory_includes_the_processes_it_started():
    """An actor's GPU memory is its engine process's: the report counts the reporting process's descendants (a real
    child and grandchild here) and no one else's."""
    import subprocess
    import sys

    grandchild = "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], " \
                 "stdin=subprocess.PIPE); print(p.pid, flush=True); sys.stdin.read(); p.stdin.close(); p.wait()"
    child = subprocess.Popen([sys.executable, "-c", grandchild], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        engine = int(child.stdout.readline())
        assert telemetry.process_tree(os.getpid()) >= {os.getpid(), child.pid, engine}
        assert 1 not in telemetry.process_tree(os.getpid())

        class Listing(_FakeNvml):
            def nvmlDeviceGetName(self, handle: int) -> str:
                return "NVIDIA H200"

            def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:
                return [self.Proc(engine, 3 * 2**30), self.Proc(1, 2**30), self.Proc(child.pid, None)]

        sampler = object.__new__(telemetry._Nvml)        # NVML's library is what is stood in for, not the sampler
        sampler.module, sampler.reason = Listing(), ""
        assert [d.process_memory_bytes for d in sampler.devices()] == [3 * 2**30, 3 * 2**30]
    finally:
        child.stdin.close()
        child.wait(60)


def test_history_series_and_rates():
    state = ServiceState(Target("l", "127.0.0.1:1", "learner"), history=deque(maxlen=4))
    for t, (step, loss, consumed) in enumerate([(0, 0.9, 0), (1, 0.5, 0), (1, 0.5, 2), (2, 0.4, 4), (3, 0.3, 10)]):
        state.history.append((100.0 + t, {"step": step, "loss": loss, "consumed": consumed}))
    assert state.series("loss") == [0.5, 0.5, 0.4, 0.3]                    # the oldest fell out of the history
    assert state.series("loss", per="step") == [0.5, 0.4, 0.3]
    assert state.rate("consumed") == pytest.approx(10 / 3)
    assert ServiceState(Target("x", "127.0.0.1:1")).rate("consumed") is None


def test_discover_reads_a_services_key_from_its_key_file(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "gateway.key").write_text("# forge up's gateway API key\nthe-gateway-key\n")
    (tmp_path / "services.json").write_text(json.dumps([
        {"name": "gateway", "kind": "gateway", "address": "127.0.0.1:7001",
         "api_key_file": str(tmp_path / "keys" / "gateway.key")},
        {"name": "actor-0", "kind": "actor", "address": "127.0.0.1:7002", "api_key_file": str(tmp_path / "gone")},
        {"name": "learner", "kind": "learner", "address": "127.0.0.1:7003"}]))
    keys = {t.name: t.api_key for t in discover(tmp_path)}
    assert keys == {"gateway": "the-gateway-key", "actor-0": None, "learner": None}
