"""The shared gRPC server helpers, threaded and asyncio, each run as a real process on loopback: health, reflection,
API keys, graceful stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from forge.rpc import connect
from forge.v1 import common_pb2, learner_pb2_grpc

from conftest import HELPERS

SERVER = HELPERS / "stats_server.py"


class ServerProcess:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SERVER), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT"):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        _, port, _, self.address = line.split()
        self.port = int(port)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> tuple[int, str]:
        self.proc.send_signal(sig)
        out, self.stderr = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out


@pytest.fixture(scope="module", params=["threads", "asyncio"])
def kind(request) -> tuple[str, ...]:
    """The helper's arguments that pick the server kind."""
    return ("--asyncio",) if request.param == "asyncio" else ()


@pytest.fixture(scope="module")
def server(kind):
    """A server of each kind for the tests that only call it (started once per kind)."""
    proc = ServerProcess(*kind)
    yield proc
    if proc.proc.poll() is None:
        proc.proc.kill()
        proc.proc.wait()


def test_binds_loopback_by_default_and_serves_health(server):
    assert server.address.startswith("127.0.0.1:")
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "forge.v1.Learner"):
            response = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="forge.v1.Nope"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        report = learner_pb2_grpc.LearnerStub(channel).Stats(common_pb2.StatsRequest(), timeout=10)
        assert report.service == "learner" and report.gauges["step"] == 7.0


def test_reflection_lists_and_describes_services(server):
    with grpc.insecure_channel(server.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"forge.v1.Learner", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
        described = database.FindFileContainingSymbol("forge.v1.Learner")
        assert described.package == "forge.v1"
        assert [m.name for m in described.service[0].method] == ["Stats"]


def test_sigterm_stops_gracefully_letting_in_flight_calls_finish(kind):
    proc = ServerProcess("--slow-s", "1.5", *kind)
    result: dict = {}
    channel = grpc.insecure_channel(proc.address)

    def call() -> None:
        try:
            result["report"] = learner_pb2_grpc.LearnerStub(channel).Stats(common_pb2.StatsRequest(), timeout=20)
        except grpc.RpcError as exc:
            result["error"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.5)
    code, out = proc.stop(signal.SIGTERM)
    worker.join(20)
    channel.close()
    assert code == 0 and "STOPPED" in out
    assert "report" in result, result.get("error")


def test_sigint_stops_too(kind):
    proc = ServerProcess(*kind)
    code, out = proc.stop(signal.SIGINT)
    assert code == 0 and "STOPPED" in out


def test_api_keys_are_required_except_for_health(kind):
    proc = ServerProcess("--api-key", "k-123", "--api-key", "k-456", *kind)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stub = learner_pb2_grpc.LearnerStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Stats(common_pb2.StatsRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "missing" in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                stub.Stats(common_pb2.StatsRequest(), timeout=10, metadata=(("authorization", "Bearer nope"),))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid" in err.value.details()
        for key in ("k-123", "k-456"):
            with connect(proc.address, api_key=key) as channel:
                assert learner_pb2_grpc.LearnerStub(channel).Stats(common_pb2.StatsRequest(), timeout=10).gauges
    finally:
        proc.stop()
    assert "k-123" not in proc.stderr and "nope" not in proc.stderr


CORRUPT = b"\xff\xff\xff\xff"        # no valid protobuf: a field tag beyond the wire format's


def raw_call(channel: grpc.Channel, method: str, streaming: bool = False, **kwargs):
    identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
    if streaming:
        return list(channel.stream_stream(method, **identity)(iter([CORRUPT]), timeout=10, **kwargs))
    return channel.unary_unary(method, **identity)(CORRUPT, timeout=10, **kwargs)


def test_undecodable_requests_are_invalid_argument_on_every_service(kind):
    proc = ServerProcess("--api-key", "k-123", *kind)
    key = (("authorization", "Bearer k-123"),)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            with pytest.raises(grpc.RpcError) as err:           # the key is checked before the request is read
                raw_call(channel, "/forge.v1.Learner/Stats")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            for method, streaming, metadata in (("/forge.v1.Learner/Stats", False, key),
                                                ("/grpc.health.v1.Health/Check", False, ()),
                                                ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                                 True, key)):
                with pytest.raises(grpc.RpcError) as err:
                    raw_call(channel, method, streaming, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.details())
                assert "could not be decoded" in err.value.details()
            stub = learner_pb2_grpc.LearnerStub(channel)
            assert stub.Stats(common_pb2.StatsRequest(), timeout=10, metadata=key).gauges["step"] == 7.0
    finally:
        proc.stop()
    assert "Traceback" not in proc.stderr and "DecodeError" not in proc.stderr


@pytest.mark.parametrize("server_kind", ["threads", "asyncio"])
def test_a_taken_port_is_a_clear_error(server, server_kind):
    from forge.rpc.aio_server import AioGrpcServer
    from forge.rpc.server import GrpcServer, ServerOptions

    with pytest.raises(OSError, match="cannot bind"):
        (AioGrpcServer if server_kind == "asyncio" else GrpcServer)([], ServerOptions(port=server.port))
    assert not [t for t in threading.enumerate() if t.name == "grpc-aio"]      # a failed start leaves no loop
