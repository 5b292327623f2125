"""The Pool gRPC service as a standalone server process (``python -m forge.pool``): an API key, a client round trip
and a graceful stop on SIGTERM. (The service in process: unit/test_pool_service.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from forge.pool import (
    Pool,
    PoolClient,
)
from forge.v1 import common_pb2, pool_pb2_grpc

from helpers.pool_util import make_call, same_call


def test_a_standalone_server_process_with_an_api_key(tmp_path):
    path = tmp_path / "pool"
    proc = subprocess.Popen([sys.executable, "-m", "forge.pool", "--path", str(path), "--port", "0",
                             "--api-key", "sekret", "--map-size", "1MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving the pool"), line + proc.stderr.read()
        address = line.split()[-1]
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="forge.v1.Pool"), timeout=30)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                pool_pb2_grpc.PoolStub(channel).Stats(common_pb2.StatsRequest(), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with PoolClient(address, api_key="sekret") as client:
            sid = client.open_session(session_id="remote").session_id
            client.append_call(make_call(sid, 0))
            client.close_session(session_id=sid)
            assert [e.position for e in client.fetch(1).entries] == [0]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with Pool(path) as pool:
        assert same_call(pool.get_session("remote").calls[0], make_call("remote", 0))
