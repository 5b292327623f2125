"""Routers named by dotted path in a real forge-gateway: every call goes through one named so, and a spec that names
no router is refused before anything loads. (The registry and the constructor contract:
unit/test_router_registry.py.)"""

from __future__ import annotations

import os
import subprocess

import pytest

from forge.rpc import connect
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from conftest import REPO, script
from helpers.gateway_fake_actor import serve_fake_actor
from helpers.gateway_procs import start_gateway

SPEC = "helpers.custom_router:LastHealthyRouter"


def test_a_gateway_routes_every_call_through_a_router_named_by_dotted_path(tmp_path):
    fakes = [serve_fake_actor("script", [5, 6, 7]) for _ in range(3)]
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)}
    gateway = start_gateway(tmp_path, [server.address for server, _ in fakes], tmp_path / "pool", "--router", SPEC,
                            "--health-interval", "0.2", env=env)
    try:
        stub = gateway_pb2_grpc.GatewayStub(connect(gateway.grpc_address))
        sampling = common_pb2.SamplingParams(temperature=0, max_tokens=3)

        def session() -> str:
            return stub.StartSession(gateway_pb2.StartSessionRequest(task_id="t"), timeout=10).session.session_id

        def call(session_id: str, prompt: list[int]) -> list[int]:
            request = gateway_pb2.SessionGenerateRequest(session_id=session_id, prompt_ids=prompt, sampling=sampling)
            return [t for chunk in stub.Generate(request, timeout=30) for t in chunk.token_ids]

        for i in range(4):
            session_id = session()
            for turn in range(2):
                assert call(session_id, [11, 12, 13, i, turn]) == [5, 6, 7]
        assert [servicer.calls for _, servicer in fakes] == [0, 0, 8]        # all on the last actor
        report = stub.Stats(common_pb2.StatsRequest(), timeout=10)
        gauges = dict(report.gauges)
        assert gauges["custom_router/start"] == 1 and gauges["custom_router/session_affinity"] == 1
        assert gauges["custom_router/choose"] == 4                # asked for each new session; turns stay home
        assert gauges["custom_router/on_first_token"] == gauges["custom_router/on_done"] == 8
        assert report.labels["router"] == f"{SPEC}+affinity"

        fakes[2][0].stop(0)                                       # the last actor goes: the one before it is picked
        assert call(session(), [21, 22, 23]) == [5, 6, 7]
        assert [servicer.calls for _, servicer in fakes] == [0, 1, 8]
    finally:
        gateway.stop()
        for server, _ in fakes:
            server.stop(0)


@pytest.mark.parametrize(("spec", "reason"), [
    ("random", "unknown router 'random': give one of cost-aware, cache-aware, kv-overlap, round-robin, least-loaded"),
    ("no_such_package.routers:MyRouter", "cannot import module 'no_such_package.routers'"),
])
def test_the_gateway_refuses_a_spec_that_names_no_router_before_loading_anything(tmp_path, spec, reason):
    pool, model = tmp_path / "pool", tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')    # resolves, but fails if it is loaded
    result = subprocess.run([script("forge-gateway"), "--router", spec, "--model", str(model),
                             "--actor", "127.0.0.1:1", "--pool", str(pool)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "Error" in line]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr         # one line, and nothing after it
    assert errors[0].startswith("Error: Invalid value for '--router': ") and reason in errors[0]
    assert "json" not in result.stderr.lower() and not pool.exists()          # neither the model nor the pool
