"""Grammars checked where they arrive, against real processes on loopback: the gateway compiles a call's grammar in
its grammar sandbox while its event loop goes on serving (health and other calls answer while a compilation is held
up), and an actor reached directly refuses a grammar beyond the bounds, one that does not compile, and one that needs
more memory than its sandbox may take, with INVALID_ARGUMENT, and serves on."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import grpc
import httpx
import pytest

from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

from helpers.gateway_procs import start_gateway
from helpers.processes import start_actor
from helpers.random_model import random_tiny
from helpers.waiting import wait_for

SANDBOX_MODULE = "forge.structured.sandbox"
PROPERTIES = {f"p{i}": {"type": "array", "items": {"type": "integer"}, "maxItems": 2000} for i in range(20)}
HEAVY_SCHEMA = {"type": "array", "items": {"type": "object", "properties": PROPERTIES}, "maxItems": 10000}


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """An actor whose grammar sandbox may take 64 MiB, and a gateway in front of it whose compilations may take as
    long as a held-up child needs (the test holds one up)."""
    directory = tmp_path_factory.mktemp("grammar-checks")
    actor = start_actor(directory, "--model", str(random_tiny(directory)), "--grammar-memory-mb", "64")
    try:
        gateway = start_gateway(directory, [actor.address], directory / "pool", "--grammar-timeout", "600")
        try:
            yield actor, gateway
        finally:
            gateway.stop()
    finally:
        actor.stop()


def sandbox_children(parent: int) -> list[int]:
    """The pids of ``parent``'s grammar sandbox processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == parent and SANDBOX_MODULE.encode() in command:
            found.append(int(entry.name))
    return found


def chat(schema: dict | None = None) -> dict:
    body: dict = {"model": "forge-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return body


def test_the_gateway_serves_on_while_a_grammar_compiles(services):
    _actor, gateway = services
    with httpx.Client(base_url=gateway.http, timeout=120) as http:
        assert http.post("/v1/chat/completions", json=chat({"type": "object"})).status_code == 200
        [checker] = sandbox_children(gateway.proc.pid)
        os.kill(checker, signal.SIGSTOP)                   # a compilation that cannot finish until it is let go
        answered: dict = {}
        held = threading.Thread(target=lambda: answered.update(
            response=http.post("/v1/chat/completions", json=chat({"type": "array", "items": {"type": "integer"}}))))
        try:
            held.start()
            wait_for(lambda: "State:\tT" in Path(f"/proc/{checker}/status").read_text(), "the checker to stop")
            assert http.get("/health").json() == {"status": "ok"}
            assert http.post("/v1/chat/completions", json=chat()).status_code == 200
            assert http.post("/v1/chat/completions", json=chat({"type": "object"})).status_code == 200   # known
            assert held.is_alive() and "response" not in answered
        finally:
            os.kill(checker, signal.SIGCONT)
            held.join()
        assert answered["response"].status_code == 200, answered["response"].text


def generate(actor_address: str, grammar: common_pb2.Grammar) -> list[actor_pb2.GenerateChunk]:
    with grpc.insecure_channel(actor_address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        sampling = common_pb2.SamplingParams(max_tokens=4, temperature=0, grammar=grammar)
        return list(stub.Generate(actor_pb2.GenerateRequest(prompt_ids=[4, 5, 6], sampling=sampling), timeout=120))


@pytest.mark.parametrize("grammar, says", [
    (common_pb2.Grammar(json_schema=json.dumps({"type": "array", "minItems": 1_000_000_000})), "minItems"),
    (common_pb2.Grammar(json_schema=json.dumps({"$ref": "#"})), "no finite document"),
    (common_pb2.Grammar(json_schema=json.dumps({"type": "foo"})), "Invalid type: foo"),
    (common_pb2.Grammar(lark="start: x"), "cannot be compiled"),
    (common_pb2.Grammar(lark='start: "{" a\na: b\nb: a'), "fails after 1 token"),
    (common_pb2.Grammar(json_schema=json.dumps(HEAVY_SCHEMA)), "needs more than 64 MiB"),
])
def test_an_actor_refuses_grammars_it_cannot_run_and_serves_on(services, grammar, says):
    actor, _gateway = services
    with pytest.raises(grpc.RpcError) as refused:
        generate(actor.address, grammar)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details()
    assert actor.alive
    chunks = generate(actor.address, common_pb2.Grammar(json_object=True))
    assert chunks[-1].finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
