"""A Tinker stack on loopback for the SDK and cookbook suites: a forge-actor following the server's adapter source
(the built-in model, whose tokenizer the SDK loads from its directory) and a forge-tinker in front of it that offers
that model, with the keys the tests' clients use; and a runner for the programs under tests/tinker/programs in the
SDK's environment (FORGE_TINKER_PYTHON)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from forge.assets import TINY_DIR

from conftest import free_port
from helpers.processes import Service, start_actor

PROGRAMS = Path(__file__).parent.parent / "tinker" / "programs"
KEYS = ("tml-team-a", "tml-team-b")


@dataclass
class TinkerStack:
    directory: Path
    actor: Service
    server: Service
    base_model: str
    server_args: tuple[str, ...] = ()

    def restart_server(self) -> None:
        """Kill the server (SIGKILL: nothing is flushed or closed) and start it again with the same settings on the
        same run directory and adapter source; its HTTP port is a new one (``base_url``)."""
        self.server.kill()
        self.server = start_server(self.directory, self.server_args)

    @property
    def base_url(self) -> str:
        return self.server.info["base_url"]

    def run(self, program: str, *args: str, key: str = KEYS[0], timeout_s: float = 900) -> dict:
        """Run a program in the SDK's environment against the server; its last line of output, as JSON."""
        done = self.python(str(PROGRAMS / program), *args, key=key, timeout_s=timeout_s)
        return json.loads(done.stdout.strip().splitlines()[-1])

    def python(self, *args: str, key: str = KEYS[0], timeout_s: float = 900) -> subprocess.CompletedProcess:
        """The SDK environment's python with ``args``, pointed at the server with ``key``; it must succeed."""
        env = {**os.environ, "TINKER_BASE_URL": self.base_url, "TINKER_API_KEY": key, "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run([os.environ["FORGE_TINKER_PYTHON"], *args], capture_output=True, text=True, env=env,
                              timeout=timeout_s, cwd=self.directory)
        assert done.returncode == 0, (f"{' '.join(args[:2])} failed:\n{done.stderr[-6000:]}\n--- server log ---\n"
                                      f"{self.server.log_text()[-3000:]}")
        return done


def start_server(directory: Path, args: tuple[str, ...]) -> Service:
    return Service("tinker", "forge-tinker", list(args), directory, timeout_s=120)


@contextlib.contextmanager
def tinker_stack(directory: Path, *server_args: str) -> Iterator[TinkerStack]:
    fetch, announce = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    base_model = str(TINY_DIR)
    actor = start_actor(directory, "--model", base_model, "--threads", "1", "--adapter-source", f"{fetch},{announce}")
    try:
        keys = [arg for key in KEYS for arg in ("--api-key", key)]
        args = ("--port", "0", "--grpc-port", "0", *keys, "--run-dir", str(directory / "models"), "--base-model",
                base_model, "--actor", actor.address, "--weights-fetch", fetch, "--weights-announce", announce,
                *server_args)
        stack = TinkerStack(directory, actor, start_server(directory, args), base_model, args)
        try:
            yield stack
        finally:
            stack.server.stop()
    finally:
        actor.stop()
