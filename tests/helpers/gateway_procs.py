"""Real actor and gateway processes on loopback for the gateway tests (and the benchmark): start with a ready file,
stop with a signal, read their logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


class Proc:
    def __init__(self, args: list[str], ready: Path, log: Path, timeout: float = 120.0) -> None:
        self.args, self.ready_path, self.log_path = args, ready, log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{args[0]} did not start:\n{self.log()}")
            time.sleep(0.05)
        self.info = json.loads(ready.read_text())

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def start_actor(directory: Path, name: str = "actor", *extra: str) -> Proc:
    ready = directory / f"{name}.json"
    ready.unlink(missing_ok=True)
    args = [str(BIN / "forge-actor"), "--port", "0", "--ready-file", str(ready), "--kv-cache-mb", "64",
            "--threads", "1", *extra]
    proc = Proc(args, ready, directory / f"{name}.log")
    proc.address = proc.info["address"]
    return proc


def start_gateway(directory: Path, actors: list[str], pool: Path, *extra: str, name: str = "gateway") -> Proc:
    ready = directory / f"{name}.json"
    ready.unlink(missing_ok=True)
    args = [sys.executable, "-m", "forge.gateway", "--pool", str(pool), "--grpc-port", "0", "--http-port", "0",
            "--ready-file", str(ready), "--shutdown-grace", "10",
            *[a for actor in actors for a in ("--actor", actor)], *extra]
    proc = Proc(args, ready, directory / f"{name}.log")
    proc.grpc_address, proc.http, proc.base_url = proc.info["grpc_address"], proc.info["http_address"], \
        proc.info["base_url"]
    return proc
