"""Real actor and gateway processes on loopback for the gateway tests (and the benchmark), through forge.launch: one
of each, a random actor and a gateway in front of it (the ``stack`` fixture), a fleet of prefill and decode actors
behind gateways, and seeded chat sessions through a gateway."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from forge.launch import ServiceProcess
from forge.pool import PoolReader


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


@dataclass
class Stack:
    """A random-weight actor and a gateway in front of it; the gateway's pool is at ``pool``, read by ``reader``."""
    directory: Path
    actor: Proc
    gateway: Proc
    reader: PoolReader

    @property
    def pool(self) -> Path:
        return self.directory / "pool"


@contextlib.contextmanager
def gateway_stack(directory: Path, gateway_args: Sequence[str] = (),
                  prepare_checkpoint: Callable[[Path], None] | None = None) -> Iterator[Stack]:
    """Start a random actor (its checkpoint in DIRECTORY/random-tiny, which ``prepare_checkpoint`` may edit) and a
    gateway in front of it with ``gateway_args`` (``{checkpoint}`` formatted in); stop both after."""
    actor = random_actor(directory)
    try:
        checkpoint = directory / "random-tiny"
        if prepare_checkpoint is not None:
            prepare_checkpoint(checkpoint)
        gateway = start_gateway(directory, [actor.address], directory / "pool",
                                *(arg.format(checkpoint=checkpoint) for arg in gateway_args))
        try:
            with PoolReader(directory / "pool") as reader:
                yield Stack(directory, actor, gateway, reader)
        finally:
            gateway.stop()
    finally:
        actor.stop()


@contextlib.contextmanager
def disaggregated_fleet(directory: Path, model: str, decoders: int = 1, *gateway_args: str) -> Iterator[dict]:
    """Actors serving ``model`` through an L3 cache, behind two gateways: ``whole`` in front of a ``both`` actor, and
    ``split`` in front of ``decoders`` decode actors (``decode``, a list) with a ``prefill`` actor that prefills
    every call (``--prefill-min-tokens 1``). Both gateways get ``gateway_args``; their pools are DIRECTORY/pool-whole
    and DIRECTORY/pool-split. Yields them by name, with ``dir`` and ``model``; stops every one after."""
    from helpers.processes import start_cache

    started: list[ServiceProcess] = []

    def keep(proc: ServiceProcess) -> ServiceProcess:
        started.append(proc)
        return proc

    try:
        l3 = ("--l3-cache", keep(start_cache(directory, "cache")).address)
        both = keep(start_actor(directory, "both", "--model", model))
        prefill = keep(start_actor(directory, "prefill", "--model", model, "--role", "prefill", *l3))
        decode = [keep(start_actor(directory, f"decode-{i}", "--model", model, "--role", "decode", *l3))
                  for i in range(decoders)]
        whole = keep(start_gateway(directory, [both.address], directory / "pool-whole", *gateway_args,
                                   name="gateway-whole"))
        split = keep(start_gateway(directory, [d.address for d in decode], directory / "pool-split", *gateway_args,
                                   "--prefill-actor", prefill.address, "--prefill-min-tokens", "1",
                                   name="gateway-split"))
        yield {"whole": whole, "split": split, "prefill": prefill, "decode": decode, "both": both, "dir": directory,
               "model": model}
    finally:
        for proc in reversed(started):
            proc.stop()


def calls_of(pool: Path, sessions: list[str]) -> list:
    """The calls of ``sessions`` recorded in the pool at ``pool`` (``pool_pb2.CallRecord``), in order."""
    with PoolReader(pool) as reader:
        return [c for s in sessions for c in reader.get_session(s).calls]


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
