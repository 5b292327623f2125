"""Starting Forge services as child processes: each writes a ready file once serving; stopping sends SIGTERM and
waits for a clean exit (SIGKILL after a grace period). Output goes to a log file per service."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def console_script(name: str) -> str:
    """The path of a Forge console script installed beside the running interpreter."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed (pip install -e .)")
    return found


class ServiceProcess:
    def __init__(self, name: str, command: str, args: list[str], run_dir: Path, env: dict[str, str] | None = None,
                 timeout_s: float = 180.0, inherit_env: bool = True, wait: bool = True) -> None:
        """Start console script ``command`` (or a Python file, given by its path, run with this interpreter) with
        ``args`` (plus ``--ready-file``) and, with ``wait``, wait until it is ready (else call ``wait_ready`` later:
        services that do not need each other start side by side); the ready file is RUN_DIR/NAME.json and the log
        RUN_DIR/logs/NAME.log. ``env`` goes on top of this process's environment, or is the whole of it
        (``inherit_env=False``)."""
        self.name = name
        self.ready_file = run_dir / f"{name}.json"
        self.ready_file.unlink(missing_ok=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir / "logs" / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.timeout_s = timeout_s
        self._started = time.monotonic()
        self.info: dict[str, Any] = {}
        program = [sys.executable, command] if command.endswith(".py") else [console_script(command)]
        self.proc = subprocess.Popen([*program, *args, "--ready-file", str(self.ready_file)],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**(os.environ if inherit_env else {}), "PYTHONUNBUFFERED": "1",
                                          **(env or {})},
                                     start_new_session=True)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> ServiceProcess:
        """Wait until the service is ready (at most ``timeout_s`` from its start) and read its ready file into
        ``info``; a service that exits or runs out of time first is an error naming its log."""
        if self.info:
            return self
        deadline = self._started + self.timeout_s
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}:\n"
                                   + self.log_text()[-2000:])
            if time.monotonic() > deadline:
                self.proc.kill()
                raise TimeoutError(f"{self.name} was not ready after {self.timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.05)
        time.sleep(0.05)            # the file is replaced atomically, but give the writer a beat
        self.info = json.loads(self.ready_file.read_text())
        log.info("%s ready (pid %d): %s", self.name, self.proc.pid, self.info)
        return self

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:           # the run directory was removed under us
            return f"(no log: {self.log_path} is gone)"

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit (SIGKILL after ``grace_s``); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s: killing it", self.name, grace_s)
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)
