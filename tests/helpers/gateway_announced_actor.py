"""An Actor service a gateway finds in its actors directory: it answers Stats (with its role label) and health,
announces itself with a ready file as forge-actor does, and can hold its calls after their first token until the
test lets them finish (a call that is surely in flight, whatever the machine's speed)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from forge.rpc import GrpcServer, ServiceBinding, serve
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2


class AnnouncedActor(actor_pb2_grpc.ActorServicer):
    def __init__(self, role: str = "both", hold: bool = False, name: str = "announced") -> None:
        self.role = role
        self.name = name
        self.calls = 0
        self.holding = threading.Event()        # set once a call waits for ``release``
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def Generate(self, request, context):
        self.calls += 1
        yield actor_pb2.GenerateChunk(request_id=request.request_id, token_ids=[72], logprobs=[-1.0],
                                      weight_versions=[0], actor=self.name)
        if not self.release.is_set():
            self.holding.set()
            self.release.wait(300)
        yield actor_pb2.GenerateChunk(request_id=request.request_id, token_ids=[73], logprobs=[-1.0],
                                      weight_versions=[0], actor=self.name,
                                      finish_reason=common_pb2.FINISH_REASON_STOP)

    def Abort(self, request, context):
        return actor_pb2.AbortResponse(found=False)

    def Stats(self, request, context):
        return common_pb2.StatsReport(service="actor", instance=self.name, labels={"role": self.role})


def serve_announced_actor(role: str = "both", hold: bool = False, name: str = "announced"
                          ) -> tuple[GrpcServer, AnnouncedActor]:
    servicer = AnnouncedActor(role, hold, name)
    server = serve([ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer, actor_pb2, "Actor")])
    return server, servicer


def announce(directory: Path, name: str, address: str, **fields: object) -> Path:
    """Write DIRECTORY/NAME.json as forge-actor writes its ready file: whole at once (os.replace)."""
    path = directory / f"{name}.json"
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"address": address, "instance": name, "pid": os.getpid(), **fields}))
    os.replace(temporary, path)
    return path
