"""Real actor and gateway processes on loopback for the gateway tests (and the benchmark), through forge.launch."""

from __future__ import annotations

from pathlib import Path

import httpx

from forge.launch import ServiceProcess


class Proc(ServiceProcess):
    def log(self) -> str:
        return self.log_text()

    def alive(self) -> bool:          # the gateway tests call it
        return self.proc.poll() is None


def start_actor(directory: Path, name: str = "actor", *extra: str) -> Proc:
    proc = Proc(name, "forge-actor", ["--port", "0", "--kv-cache-mb", "64", "--threads", "1", *extra], directory,
                timeout_s=120)
    proc.address = proc.info["address"]
    return proc


def random_actor(directory: Path) -> Proc:
    """An actor serving a random-weight copy of the tiny architecture written into ``directory``."""
    from helpers.random_model import random_tiny

    return start_actor(directory, "actor", "--model", str(random_tiny(directory)))


def start_gateway(directory: Path, actors: list[str], pool: Path, *extra: str, name: str = "gateway",
                  env: dict[str, str] | None = None) -> Proc:
    args = ["--pool", str(pool), "--grpc-port", "0", "--http-port", "0", "--shutdown-grace", "10",
            *[a for actor in actors for a in ("--actor", actor)], *extra]
    proc = Proc(name, "forge-gateway", args, directory, env=env, timeout_s=120)
    proc.grpc_address, proc.http, proc.base_url = (proc.info["grpc_address"], proc.info["http_address"],
                                                   proc.info["base_url"])
    return proc


def chat_calls(gateway, run: str, count: int) -> list[str]:
    """``count`` seeded two-turn sessions; their ids."""
    sessions = []
    with httpx.Client(timeout=120) as http:
        for i in range(count):
            session = f"{run}-{i}"
            url = f"{gateway.http}/s/{session}/v1/chat/completions"
            messages = [{"role": "system", "content": "You are a careful assistant. " * 6},
                        {"role": "user", "content": f"Question {i}: what is {i} + {3 * i}?"}]
            for turn in range(2):
                response = http.post(url, json={"messages": messages, "max_tokens": 10, "seed": 100 * i + turn,
                                                "temperature": 0.9, "stream": turn == 1})
                assert response.status_code == 200, response.text
                if turn == 0:
                    messages += [response.json()["choices"][0]["message"], {"role": "user", "content": "And?"}]
            sessions.append(session)
    return sessions
