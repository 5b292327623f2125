"""The learner's gRPC surface: its Stats (step, loss, reward per domain, tokens/s, staleness, window)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from forge.rpc import ServerOptions, ServiceBinding
from forge.rpc.server import GrpcServer
from forge.telemetry import stats_report
from forge.v1 import common_pb2, learner_pb2, learner_pb2_grpc


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(self, latest: Callable[[], dict[str, Any]], instance: str = "learner",
                 labels: dict[str, str] | None = None) -> None:
        self.latest = latest
        self.instance = instance
        self.labels = labels or {}
        self.started = time.time()

    def Stats(self, request: common_pb2.StatsRequest, context) -> common_pb2.StatsReport:
        return self.report()

    def report(self) -> common_pb2.StatsReport:
        """What Stats answers (and a Prometheus scrape reads)."""
        gauges = {k: float(v) for k, v in self.latest().items() if isinstance(v, int | float)}
        return stats_report("learner", self.instance, self.started, gauges, self.labels)


def serve_learner(servicer: LearnerServicer, options: ServerOptions) -> GrpcServer:
    binding = ServiceBinding.of(learner_pb2_grpc.add_LearnerServicer_to_server, servicer, learner_pb2, "Learner")
    return GrpcServer([binding], options).start()
