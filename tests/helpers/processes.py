"""Forge services as real processes for tests (through forge.launch): started with a ready file, stopped by a
signal."""

from __future__ import annotations

from pathlib import Path

from forge.launch import ServiceProcess


class Service(ServiceProcess):
    @property
    def address(self) -> str:
        return self.info["address"]

    @property
    def log(self) -> Path:
        return self.log_path


def start_actor(directory: Path, *args: str, name: str = "actor") -> Service:
    return Service(name, "forge-actor", ["--port", "0", "--kv-cache-mb", "32", *args], directory, timeout_s=120)
