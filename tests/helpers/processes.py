"""Start Forge services as real processes for tests: wait for their ready file, stop them with a signal."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from conftest import script


class Service:
    def __init__(self, command: str, args: list[str], ready_file: Path, timeout: float = 120.0) -> None:
        self.ready_file = ready_file
        self.log = ready_file.with_suffix(".log")
        self._log_handle = self.log.open("w")
        self.proc = subprocess.Popen([script(command), *args, "--ready-file", str(ready_file)],
                                     stdout=self._log_handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{command} did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        self.info = json.loads(ready_file.read_text())

    @property
    def address(self) -> str:
        return self.info["address"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_handle.close()
        return self.proc.returncode


def start_actor(directory: Path, *args: str, name: str = "actor") -> Service:
    return Service("forge-actor", ["--port", "0", "--kv-cache-mb", "32", *args], directory / f"{name}.json")
