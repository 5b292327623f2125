"""Plain-data snapshots of the polled services (``forge top --once --json``) and of the local machine."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf.message import Message

from forge import telemetry
from forge.app.top.poller import ServiceState
from forge.v1 import common_pb2


def message_dict(message: Message) -> dict[str, Any]:
    """Every field of a flat message (unset ones too), numbers as numbers (unlike json_format's uint64 strings)."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}


def report_dict(report: common_pb2.StatsReport) -> dict[str, Any]:
    return {
        "service": report.service, "instance": report.instance, "version": report.version,
        "uptime_s": report.uptime_s, "timestamp": report.timestamp,
        "gauges": dict(sorted(report.gauges.items())), "labels": dict(sorted(report.labels.items())),
        "devices": [message_dict(d) for d in report.devices],
        "host": message_dict(report.host),
    }


def service_dict(state: ServiceState) -> dict[str, Any]:
    """Status and figures of one service; a down service keeps its last report under ``last_report``."""
    out: dict[str, Any] = {
        "name": state.name, "kind": state.kind or state.target.kind, "address": state.target.address,
        "status": state.status, "since": state.since,
    }
    if state.status == "up" and state.report is not None:
        out["latency_ms"] = state.latency_s * 1e3
        out.update(report_dict(state.report))
    else:
        out["reason"] = state.reason
        out["last_seen"] = state.last_seen or None
        if state.report is not None:
            out["last_report"] = report_dict(state.report)
    return out


@dataclass
class LocalMachine:
    """This machine's figures, read directly (host through /proc, GPUs and their processes through NVML)."""

    host: common_pb2.HostStats
    devices: list[common_pb2.DeviceStats]
    processes: list[telemetry.GpuProcess] = field(default_factory=list)
    hostname: str = ""


def sample_local() -> LocalMachine:
    gpus = telemetry.nvml()
    return LocalMachine(host=telemetry.host_stats(), devices=gpus.devices(), processes=telemetry.gpu_processes(),
                        hostname=os.uname().nodename)


def local_dict(local: LocalMachine) -> dict[str, Any]:
    host = message_dict(local.host)
    host.pop("process_rss_bytes", None)      # of `forge top` itself: not a figure of the system
    devices = [message_dict(d) for d in local.devices]
    for device in devices:
        device.pop("process_memory_bytes", None)
    return {"hostname": local.hostname, "host": host, "devices": devices,
            "gpu_processes": [asdict(p) for p in local.processes]}


def snapshot(states: list[ServiceState], local: LocalMachine | None = None) -> dict[str, Any]:
    """Everything ``forge top --once --json`` prints."""
    services = [service_dict(s) for s in states]
    out: dict[str, Any] = {
        "time": time.time(),
        "up": sum(s["status"] == "up" for s in services), "down": sum(s["status"] != "up" for s in services),
        "services": services,
    }
    if local is not None:
        out["local"] = local_dict(local)
    return out
