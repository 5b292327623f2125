"""A process that serves the Learner service's Stats RPC through forge.rpc's server helpers (for the server tests):
the threaded ``GrpcServer``, or with ``--asyncio`` the ``AioGrpcServer`` with a coroutine handler."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from forge.rpc import ServerOptions, ServiceBinding
from forge.rpc.aio_server import AioGrpcServer
from forge.rpc.server import GrpcServer
from forge.v1 import common_pb2, learner_pb2, learner_pb2_grpc


class Learner(learner_pb2_grpc.LearnerServicer):
    def __init__(self, slow_s: float) -> None:
        self.started = time.time()
        self.slow_s = slow_s

    def Stats(self, request, context):
        time.sleep(self.slow_s)
        return self.report()

    def report(self) -> common_pb2.StatsReport:
        return common_pb2.StatsReport(service="learner", instance="test", uptime_s=time.time() - self.started,
                                      gauges={"step": 7.0})


class AsyncLearner(Learner):
    async def Stats(self, request, context):
        await asyncio.sleep(self.slow_s)
        return self.report()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", action="append", default=[])
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--asyncio", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", stream=sys.stderr)
    options = ServerOptions(port=args.port, api_keys=args.api_key, grace_s=10.0)
    if args.host:
        options.host = args.host
    servicer = (AsyncLearner if args.asyncio else Learner)(args.slow_s)
    binding = ServiceBinding.of(learner_pb2_grpc.add_LearnerServicer_to_server, servicer, learner_pb2, "Learner")
    server = (AioGrpcServer if args.asyncio else GrpcServer)([binding], options)
    server.run_until_signal(on_stop=lambda: print("STOPPED", flush=True),
                            on_ready=lambda: print(f"PORT {server.port} ADDRESS {server.address}", flush=True))


if __name__ == "__main__":
    main()
