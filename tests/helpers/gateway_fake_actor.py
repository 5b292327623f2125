"""A scripted Actor service: it fails before its first token, or after it, or answers every prompt with the same
token ids (e.g. a tool call, which a random-weight model never samples), with a log-probability of choice. It keeps
each request's prompt, stream interval and sampling parameters."""

from __future__ import annotations

import grpc

from forge.rpc import ServiceBinding, serve
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2


class FakeActor(actor_pb2_grpc.ActorServicer):
    def __init__(self, mode: str, script: list[int] | None = None, logprob: float = -0.5) -> None:
        self.mode = mode
        self.script = script or []
        self.logprob = logprob
        self.calls = 0
        self.prompts: list[list[int]] = []
        self.stream_intervals: list[int] = []
        self.samplings: list[common_pb2.SamplingParams] = []

    def Generate(self, request, context):
        self.calls += 1
        self.prompts.append(list(request.prompt_ids))
        self.stream_intervals.append(request.stream_interval)
        self.samplings.append(request.sampling)
        if self.mode == "script":
            for start in range(0, len(self.script), 3):
                ids = self.script[start:start + 3]
                chunk = actor_pb2.GenerateChunk(request_id=request.request_id, token_ids=ids,
                                                logprobs=[self.logprob] * len(ids),
                                                weight_versions=[7] * len(ids), actor="scripted")
                if start + 3 >= len(self.script):
                    chunk.finish_reason = common_pb2.FINISH_REASON_STOP
                yield chunk
            return
        if self.mode == "error-before-first-token":
            yield actor_pb2.GenerateChunk(request_id=request.request_id, actor="fake",
                                          finish_reason=common_pb2.FINISH_REASON_ERROR, error="engine broke")
            return
        yield actor_pb2.GenerateChunk(request_id=request.request_id, token_ids=[72], logprobs=[-1.0],
                                      weight_versions=[0], actor="fake")
        context.abort(grpc.StatusCode.UNAVAILABLE, "fake actor died mid-stream")

    def Abort(self, request, context):
        return actor_pb2.AbortResponse(found=False)


def sampled_ids(tokenizer, text: str) -> list[int]:
    """``text`` as a sampler may write it (a script for the fake actor): in pieces of three characters, which are not
    the tokens encoding it whole would give, then the end of sequence."""
    return [t for i in range(0, len(text), 3) for t in tokenizer.encode(text[i:i + 3])] + [tokenizer.eos_token_id]


def serve_fake_actor(mode: str, script: list[int] | None = None, logprob: float = -0.5):
    servicer = FakeActor(mode, script, logprob)
    server = serve([ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer, actor_pb2, "Actor")])
    return server, servicer
