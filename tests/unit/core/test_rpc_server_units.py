"""The shared asyncio gRPC server in process: coroutine handlers hold no pool thread, and the server can serve on a
loop the caller runs. (Each server kind as a real process: integration/test_rpc_server.py.)"""

from __future__ import annotations

import threading

import grpc

from forge.v1 import common_pb2, learner_pb2_grpc


def test_the_asyncio_server_serves_more_open_calls_than_its_thread_pool():
    """Coroutine handlers hold no pool thread: 12 slow calls on a 4-thread pool are all in their handler at once
    (the threaded server would run 4 at a time)."""
    import asyncio

    from forge.rpc.aio_server import AioGrpcServer
    from forge.rpc.server import ServerOptions, ServiceBinding
    from forge.v1 import learner_pb2

    from helpers.stats_server import AsyncLearner

    open_calls, most = 0, 0

    class Counting(AsyncLearner):
        async def Stats(self, request, context):
            nonlocal open_calls, most
            open_calls += 1
            most = max(most, open_calls)
            try:
                await asyncio.sleep(1.0)
                return self.report()
            finally:
                open_calls -= 1

    binding = ServiceBinding.of(learner_pb2_grpc.add_LearnerServicer_to_server, Counting(0.0), learner_pb2,
                                "Learner")
    with AioGrpcServer([binding], ServerOptions(max_workers=4)) as server, \
            grpc.insecure_channel(server.address) as channel:
        stub = learner_pb2_grpc.LearnerStub(channel)
        calls = [stub.Stats.future(common_pb2.StatsRequest(), timeout=20) for _ in range(12)]
        assert all(call.result().gauges["step"] == 7.0 for call in calls)
    assert most == 12


def test_the_asyncio_server_can_serve_on_a_loop_the_caller_runs():
    """Given a running loop, the server's handlers run on it, and stopping the server leaves the loop running."""
    import asyncio

    from forge.rpc.aio_server import AioGrpcServer
    from forge.rpc.server import ServerOptions, ServiceBinding
    from forge.v1 import learner_pb2

    from helpers.stats_server import AsyncLearner

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="callers-loop", daemon=True)
    runner.start()
    seen: list[str] = []

    class Recording(AsyncLearner):
        async def Stats(self, request, context):
            seen.append(threading.current_thread().name)
            return await super().Stats(request, context)

    binding = ServiceBinding.of(learner_pb2_grpc.add_LearnerServicer_to_server, Recording(0.0), learner_pb2,
                                "Learner")
    try:
        with AioGrpcServer([binding], ServerOptions(), loop=loop) as server, \
                grpc.insecure_channel(server.address) as channel:
            assert learner_pb2_grpc.LearnerStub(channel).Stats(common_pb2.StatsRequest(), timeout=10).gauges
        assert seen == ["callers-loop"]
        assert loop.is_running() and asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "alive"), loop).result(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


def _calls_behind_a_busy_loop(options, calls: int) -> list[bool]:
    """Send ``calls`` calls to an asyncio server while its loop is blocked, long enough for them to wait in gRPC
    past a 1 s limit; then let the loop run: whether each was answered (False: gRPC cancelled it)."""
    import asyncio
    import time

    from forge.rpc.aio_server import AioGrpcServer
    from forge.rpc.server import ServiceBinding
    from forge.v1 import learner_pb2

    from helpers.stats_server import AsyncLearner

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="callers-loop", daemon=True)
    runner.start()
    binding = ServiceBinding.of(learner_pb2_grpc.add_LearnerServicer_to_server, AsyncLearner(0.0), learner_pb2,
                                "Learner")
    gate = threading.Event()
    answered = []
    try:
        with AioGrpcServer([binding], options, loop=loop) as server, \
                grpc.insecure_channel(server.address) as channel:
            stub = learner_pb2_grpc.LearnerStub(channel)
            assert stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges      # connected and serving
            loop.call_soon_threadsafe(gate.wait)                                # the loop is busy
            futures = [stub.Stats.future(common_pb2.StatsRequest(), timeout=300) for _ in range(calls)]
            time.sleep(4.0)
            gate.set()
            for future in futures:
                try:
                    answered.append(bool(future.result().gauges))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.CANCELLED, exc
                    answered.append(False)
    finally:
        gate.set()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
    return answered


def test_a_burst_of_calls_waits_for_a_busy_server():
    """An asyncio server takes up one call per turn of its loop, so a burst on a busy one waits in gRPC, which
    cancels waiting calls past a count and an age. Forge's servers let 3,000 calls wait through a blocked loop
    (gRPC's own limits cancel some past 1,000); the controls show each of its two limits at work."""
    from forge.rpc.server import ServerOptions

    assert all(_calls_behind_a_busy_loop(ServerOptions(), 3000))
    assert not all(_calls_behind_a_busy_loop(ServerOptions(max_waiting_calls=100), 1000))
    assert not all(_calls_behind_a_busy_loop(ServerOptions(unrequested_wait_s=1), 8))
