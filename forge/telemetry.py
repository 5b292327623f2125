"""Figures every service reports in its Stats RPC: host CPU and memory (always), GPUs through NVML (when present).

Without a GPU, or without the NVML library, the report says why (``gpu_unavailable_reason``) and carries the host
figures only; nothing here raises because a machine lacks a GPU.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from forge import __version__
from forge.v1 import common_pb2

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _CpuSampler:
    """CPU use of the whole host since the previous call, from /proc/stat."""

    def __init__(self) -> None:
        self._last = self._read()
        self._lock = threading.Lock()

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as handle:
                values = [int(v) for v in handle.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    def percent(self) -> float:
        with self._lock:
            now = self._read()
            last, self._last = self._last, now
        if not now or not last or now[0] == last[0]:
            return 0.0
        total, idle = now[0] - last[0], now[1] - last[1]
        return 100.0 * (1.0 - idle / total)


_cpu = _CpuSampler()


def _meminfo() -> dict[str, int]:
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return info


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it, from /proc (just ``root`` where there is none): a service's GPU
    memory may be held by a process it started (an actor's engine process, vLLM's engine core)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {root}
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):       # gone meanwhile
            continue
        children.setdefault(parent, []).append(pid)
    found, pending = {root}, [root]
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


class _Nvml:
    def __init__(self) -> None:
        self.reason = ""
        self.module = None
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                self.reason = "no GPU"
            else:
                self.module = pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
        except Exception as exc:  # pynvml raises NVMLError subclasses, e.g. when libnvidia-ml.so is missing
            self.reason = f"NVML unavailable: {exc}"

    def devices(self) -> list[common_pb2.DeviceStats]:
        nvml = self.module
        if nvml is None:
            return []
        out = []
        own = process_tree(os.getpid())
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            stats = common_pb2.DeviceStats(index=index, name=_text(nvml.nvmlDeviceGetName(handle)))
            for reader in (_utilisation, _memory, _power, _temperature, _clocks):
                try:
                    reader(nvml, handle, stats)
                except Exception:  # a figure the device does not support stays 0
                    continue
            with contextlib.suppress(Exception):        # a device that cannot list its processes
                stats.process_memory_bytes = sum(proc.usedGpuMemory or 0 for proc in
                                                 nvml.nvmlDeviceGetComputeRunningProcesses(handle) if proc.pid in own)
            out.append(stats)
        return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _utilisation(nvml, handle, stats) -> None:
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    stats.utilization_pct, stats.memory_utilization_pct = rates.gpu, rates.memory


def _memory(nvml, handle, stats) -> None:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    stats.memory_used_bytes, stats.memory_total_bytes = memory.used, memory.total


def _power(nvml, handle, stats) -> None:
    stats.power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
    stats.power_limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0


def _temperature(nvml, handle, stats) -> None:
    stats.temperature_c = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)


def _clocks(nvml, handle, stats) -> None:
    stats.sm_clock_mhz = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
    stats.memory_clock_mhz = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)


_nvml: _Nvml | None = None


def nvml() -> _Nvml:
    global _nvml
    if _nvml is None:
        _nvml = _Nvml()
    return _nvml


def host_stats() -> common_pb2.HostStats:
    memory = _meminfo()
    total = memory.get("MemTotal", 0)
    gpus = nvml()
    return common_pb2.HostStats(
        cpu_pct=_cpu.percent(),
        cpu_count=os.cpu_count() or 1,
        memory_total_bytes=total,
        memory_used_bytes=max(0, total - memory.get("MemAvailable", total)),
        process_rss_bytes=_rss_bytes(),
        gpu_available=gpus.module is not None,
        gpu_unavailable_reason=gpus.reason,
    )


def stats_report(service: str, instance: str, started: float, gauges: Mapping[str, float],
                 labels: Mapping[str, str] | None = None) -> common_pb2.StatsReport:
    """A complete StatsReport: the service's own figures plus host and GPU figures."""
    now = time.time()
    return common_pb2.StatsReport(
        service=service, instance=instance, version=__version__, uptime_s=now - started, timestamp=now,
        gauges={k: float(v) for k, v in gauges.items()}, labels=dict(labels or {}),
        devices=nvml().devices(), host=host_stats(),
    )


@dataclass(frozen=True)
class GpuProcess:
    """One process holding memory on a GPU, as NVML sees it."""

    device: int
    pid: int
    memory_bytes: int
    command: str


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def gpu_processes() -> list[GpuProcess]:
    """Every compute or graphics process on every GPU of this host with the memory it holds; [] without NVML."""
    module = nvml().module
    if module is None:
        return []
    found: dict[tuple[int, int], GpuProcess] = {}
    for index in range(module.nvmlDeviceGetCount()):
        handle = module.nvmlDeviceGetHandleByIndex(index)
        for reader in (module.nvmlDeviceGetComputeRunningProcesses, module.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                procs = reader(handle)
            except Exception:  # not supported on this device or driver
                continue
            for proc in procs:
                memory = proc.usedGpuMemory or 0
                known = found.get((index, proc.pid))
                if known is None or memory > known.memory_bytes:
                    found[(index, proc.pid)] = GpuProcess(index, proc.pid, memory, _command(proc.pid))
    return sorted(found.values(), key=lambda p: (p.device, -p.memory_bytes, p.pid))
