"""GPU host check (not collected by default; run it where a GPU is): the NVML figures of ``forge top --once --json``
— this machine's own sampling and those reported by a forge-actor running on CUDA — against ``nvidia-smi``.

    python tests/gpu/check_nvml.py [--no-actor]      # prints a table of comparisons, exits 1 on a mismatch
    pytest tests/gpu/check_nvml.py                   # the same as a test (marked gpu: skipped without CUDA)

Figures that move by themselves (utilisation, power, clocks, temperature) are compared with tolerances.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from forge.telemetry import process_tree

pytestmark = pytest.mark.gpu

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw", "power.limit",
          "temperature.gpu", "clocks.sm", "clocks.mem")
MIB = 2**20


def nvidia_smi() -> list[dict[str, str]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return [dict(zip(FIELDS, (v.strip() for v in line.split(",")), strict=True)) for line in out.strip().splitlines()]


def top_json(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "forge.app.top", "top", "--once", "--json", *args], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return json.loads(out)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:          # "[N/A]", "[Not Supported]"
        return None


def compare(where: str, device: dict, smi: dict[str, str]) -> list[tuple[str, str, object, object, bool]]:
    """(where, figure, forge, nvidia-smi, ok) for each figure of one device."""
    rows = [(where, "name", device["name"], smi["name"], device["name"] == smi["name"])]
    total = device["memory_total_bytes"]

    def near(figure: str, ours: float, key: str, scale: float, tolerance: float) -> None:
        theirs = _number(smi[key])
        if theirs is None:
            return
        rows.append((where, figure, round(ours, 1), round(theirs * scale, 1),
                     abs(ours - theirs * scale) <= tolerance))

    near("memory_total_bytes", total, "memory.total", MIB, 0.02 * total)
    near("memory_used_bytes", device["memory_used_bytes"], "memory.used", MIB, max(0.02 * total, 512 * MIB))
    near("utilization_pct", device["utilization_pct"], "utilization.gpu", 1, 30)
    near("power_w", device["power_w"], "power.draw", 1, max(40.0, 0.2 * device["power_w"]))
    near("power_limit_w", device["power_limit_w"], "power.limit", 1, 1.0)
    near("temperature_c", device["temperature_c"], "temperature.gpu", 1, 6)
    near("sm_clock_mhz", device["sm_clock_mhz"], "clocks.sm", 1, max(150.0, 0.2 * device["sm_clock_mhz"]))
    near("memory_clock_mhz", device["memory_clock_mhz"], "clocks.mem", 1, max(50.0, 0.05 * device["memory_clock_mhz"]))
    return rows


def start_actor(directory: Path) -> tuple[subprocess.Popen, dict]:
    script = Path(sys.executable).with_name("forge-actor")
    command = str(script) if script.exists() else shutil.which("forge-actor") or "forge-actor"
    ready = directory / "actor-gpu.json"
    proc = subprocess.Popen([command, "--device", "cuda", "--port", "0", "--kv-cache-mb", "256", "--ready-file",
                             str(ready)], stdout=subprocess.DEVNULL, stderr=(directory / "actor.log").open("w"))
    deadline = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("forge-actor did not start:\n" + (directory / "actor.log").read_text())
        time.sleep(0.2)
    return proc, json.loads(ready.read_text())


def check(with_actor: bool = True) -> list[tuple[str, str, object, object, bool]]:
    rows: list[tuple[str, str, object, object, bool]] = []
    with tempfile.TemporaryDirectory() as run:
        proc = info = None
        actor_pids: set[int] = set()
        if with_actor:
            proc, info = start_actor(Path(run))
        try:
            data = top_json(run)
            smi = {int(d["index"]): d for d in nvidia_smi()}
            if info is not None:        # the engine process it started holds the actor's GPU memory
                actor_pids = process_tree(info["pid"])
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    local = data["local"]
    rows.append(("local", "device count", len(local["devices"]), len(smi), len(local["devices"]) == len(smi)))
    for device in local["devices"]:
        rows += compare("local", device, smi[device["index"]])
    for service in data["services"]:
        ok = service["status"] == "up" and service["host"]["gpu_available"]
        rows.append((service["name"], "up with GPUs", service["status"], "up", ok))
        for device in service.get("devices", []):
            rows += compare(service["name"], device, smi[device["index"]])
        if info is not None and service["address"] == info["address"]:
            held = sum(d["process_memory_bytes"] for d in service.get("devices", []))
            rows.append((service["name"], "process_memory_bytes > 0", held, "> 0", held > 0))
            listed = bool(actor_pids & {p["pid"] for p in local["gpu_processes"]})
            rows.append(("local", "actor's processes among gpu_processes", listed, True, listed))
    return rows


def test_nvml_matches_nvidia_smi():
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    bad = [row for row in check() if not row[4]]
    assert not bad, bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-actor", action="store_true", help="Compare this machine's own sampling only.")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    rows = check(not args.no_actor)
    for where, figure, ours, theirs, ok in rows:
        print(f"{'ok ' if ok else 'BAD'}  {where:<14} {figure:<30} forge={ours!s:<18} nvidia-smi={theirs}")
    failed = sum(not row[4] for row in rows)
    print(f"{len(rows) - failed} of {len(rows)} figures match" + (f", {failed} do not" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
