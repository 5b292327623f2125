"""Forge services as real processes for tests (through forge.launch): started with a ready file, stopped by a
signal; and waiting until processes are gone."""

from __future__ import annotations

from pathlib import Path

from forge.launch import ServiceProcess
from forge.reaper import start_time

from helpers.waiting import wait_for


class Service(ServiceProcess):
    @property
    def address(self) -> str:
        return self.info["address"]

    @property
    def log(self) -> Path:
        return self.log_path


def start_actor(directory: Path, *args: str, name: str = "actor", timeout_s: float = 120) -> Service:
    """``timeout_s``: how long it may take to be ready (vLLM's start takes tens of seconds, or minutes)."""
    return Service(name, "forge-actor", ["--port", "0", "--kv-cache-mb", "32", *args], directory,
                   timeout_s=timeout_s)


def start_cache(directory: Path, name: str = "cache", *args: str) -> Service:
    """``forge-cache`` serving DIRECTORY/NAME (restarting it with the same name finds its blocks again)."""
    return Service(name, "forge-cache", ["--dir", str(directory / name), "--port", "0", *args], directory,
                   timeout_s=60)


def wait_gone(pids: list[int]) -> None:
    """Until none of ``pids`` runs."""
    wait_for(lambda: all(start_time(pid) is None for pid in pids), f"processes {pids} to end")
