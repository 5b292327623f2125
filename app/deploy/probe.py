"""``python -m forge.app.deploy.probe [--rank0-only] HOST:PORT``: the health probe of a multi-node learner's pods.

Only rank 0 of a learner serves gRPC (Stats, health), while one StatefulSet's pods share their probes; so the pods
run this check: rank 0 (the pod whose name ends in -0) asks its gRPC health service, the other ranks pass. Exit
status 0 when serving, 1 otherwise."""

from __future__ import annotations

import argparse
import sys

from forge import variables


def serving(address: str, timeout_s: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forge.app.deploy.probe", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT of the gRPC server")
    parser.add_argument("--rank0-only", action="store_true",
                        help="pass at once unless this pod's name (FORGE_POD_NAME, else HOSTNAME) ends in -0")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    pod = variables.read("FORGE_POD_NAME") or variables.read("HOSTNAME")
    if args.rank0_only and pod.rsplit("-", 1)[-1] != "0":
        return 0
    return 0 if serving(args.address, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
