"""A LiteLLM proxy in front of Forge's gateway: the peer baseline of ``bench/gateway_load.py``'s ``litellm`` path.

LiteLLM's proxy is what teams put in front of vLLM to log calls; here it stands in front of the gateway the same
way, so the benchmark shows what it adds per call beside what the gateway adds. It is configured as such a team
would, with nothing external: one model ``forge-tiny`` routed to ``openai/forge-tiny`` at the gateway's ``/v1``
with a dummy key, a master key that clients send, no database, no callbacks, and the model group's client headers
forwarded (``forward_client_headers_to_llm_api``), so a client's ``X-Forge-Session-Id`` reaches the gateway and
each session stays one gateway session. It logs at WARNING, as the gateway in the benchmark does, and runs
offline (``LITELLM_OFFLINE_MODE``: its bundled model cost map, nothing fetched).

LiteLLM lives in its own environment, for the benchmark only (not in the Makefile or CI); from the repository root::

    python3 -m venv .venv-litellm && .venv-litellm/bin/pip install -r bench/litellm-requirements.txt

(that is ``litellm[proxy]==1.110.2``, less two pins the package index used here lacks: see the file).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from procfs import children, cpu_s

from forge.gateway.http.app import SESSION_HEADER  # the header that pins a call to a session

__all__ = ["SESSION_HEADER", "LiteLLMProxy"]

LITELLM = Path(__file__).resolve().parent.parent / ".venv-litellm" / "bin" / "litellm"
MODEL = "forge-tiny"
MASTER_KEY = "sk-forge-bench-litellm"
SETUP = "python3 -m venv .venv-litellm && .venv-litellm/bin/pip install -r bench/litellm-requirements.txt"


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def config(gateway_url: str) -> dict[str, object]:
    """The proxy's configuration: the gateway at ``gateway_url`` (its HTTP address) as an OpenAI-compatible model."""
    return {"model_list": [{"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}",
                                                                   "api_base": gateway_url + "/v1",
                                                                   "api_key": "sk-dummy"}}],
            "litellm_settings": {"model_group_settings": {"forward_client_headers_to_llm_api": [MODEL]}},
            "general_settings": {"master_key": MASTER_KEY}}


class LiteLLMProxy:
    """A LiteLLM proxy subprocess on a free loopback port, logging to ``root/logs/litellm.log``."""

    def __init__(self, root: Path, gateway_url: str, timeout_s: float = 180.0) -> None:
        if not LITELLM.exists():
            raise FileNotFoundError(f"{LITELLM} is missing: the litellm path needs LiteLLM's own environment; "
                                    f"create it from the repository root with: {SETUP}")
        self.config_path = root / "litellm.yaml"
        self.config_path.write_text(json.dumps(config(gateway_url), indent=2))     # YAML reads JSON
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.log_path = root / "logs" / "litellm.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "LITELLM_OFFLINE_MODE": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "true",
               "LITELLM_LOG": "WARNING", "PYTHONUNBUFFERED": "1"}
        for name in ("DATABASE_URL", "REDIS_HOST", "REDIS_URL"):          # nothing external
            env.pop(name, None)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([str(LITELLM), "--config", str(self.config_path), "--host", "127.0.0.1",
                                          "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=root, start_new_session=True)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def client_headers() -> dict[str, str]:
        """What a client sends the proxy besides its own headers: the master key."""
        return {"Authorization": f"Bearer {MASTER_KEY}"}

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the LiteLLM proxy exited with {self.proc.returncode} before it was ready; see "
                                   f"{self.log_path}:\n{self.log_path.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(self.url + "/health/readiness", timeout=5) as response:
                if response.status == 200:      # (not listening yet: URLError; not ready: HTTPError; both OSErrors)
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the LiteLLM proxy at {self.url} was not ready after {timeout_s:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(0.25)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pids(self) -> list[int]:
        """The proxy's process and its descendants still running (workers, if it runs any)."""
        found, pending = [], [self.proc.pid]
        while pending:
            pid = pending.pop()
            found.append(pid)
            with contextlib.suppress(FileNotFoundError):        # a child that has just ended
                pending += children(pid)
        return found

    def cpu_s(self) -> float:
        """CPU seconds the proxy's processes still running have used."""
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(FileNotFoundError):
                total += cpu_s(pid)
        return total

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the proxy (and its process group): SIGTERM, then SIGKILL after ``grace_s``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
