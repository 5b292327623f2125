"""A real MLflow tracking server for a test: ``mlflow server`` on a free loopback port, with a SQLite store and an
artifact directory in the test's own directory, in a process group of its own (its job runners die with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

from conftest import free_port, script
from helpers.waiting import wait_for


class MlflowServer:
    """``mlflow server`` in a process group of its own (its job runners die with it)."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = (directory / "mlflow-server.log").open("w")
        self.proc = subprocess.Popen(
            [script("mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{directory / 'mlflow.db'}",
             "--artifacts-destination", str(directory / "artifacts")],
            env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        wait_for(self.healthy, "the MLflow server to answer /health", timeout_s=300, watched=[self.proc],
                 interval_s=0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.log.close()
