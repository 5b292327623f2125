"""A call that needs only the whole answer reads it as one message (the actor's GenerateWhole), against real
in-process actor servers: an actor without GenerateWhole (an older Forge) is read as a stream from then on, asked
once; an actor that fails before answering is replaced, as nothing has been shown. (The real actor's GenerateWhole:
integration/actors/test_actor_server.py.)"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from forge.gateway.actor_calls import ActorCall, first_token_s
from forge.gateway.actors import ActorSet
from forge.gateway.routing import RouteRequest
from forge.rpc import ServiceBinding, serve
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

from helpers.gateway_fake_actor import FakeActor
from helpers.method_log import MethodLog

SCRIPT = [11, 12, 13, 14, 15, 16, 17]


class WholeFake(FakeActor):
    """The scripted actor with GenerateWhole: its stream joined, or (``fails``) UNAVAILABLE before any answer."""

    def __init__(self, fails: bool = False) -> None:
        super().__init__("script", SCRIPT)
        self.fails = fails

    def GenerateWhole(self, request, context):
        if self.fails:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the actor died before it answered")
        whole = actor_pb2.GenerateChunk()
        for chunk in self.Generate(request, context):
            whole.MergeFrom(chunk)
        return whole


def start(servicer: FakeActor):
    log = MethodLog("forge.v1.Actor")
    server = serve([ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer, actor_pb2, "Actor")],
                   interceptors=[log])
    return server, log


def run_calls(addresses: list[str], calls: int, whole: bool = True) -> tuple[list[list[actor_pb2.GenerateChunk]],
                                                                               ActorSet]:
    """``calls`` calls one after another through an ActorSet of ``addresses`` (round robin): each call's chunks."""

    async def scenario():
        actors = ActorSet(addresses, "round-robin", session_affinity=False, health_interval_s=3600)
        await actors.start()
        try:
            answers = []
            for _ in range(calls):
                call = ActorCall(actors, RouteRequest("s", [1, 2, 3], 16), common_pb2.SamplingParams(max_tokens=16),
                                 whole=whole)
                answers.append([chunk async for chunk in call.chunks()])
            return answers, actors
        finally:
            await actors.close()

    return asyncio.run(scenario())


@pytest.fixture
def servers():
    started = []

    def start_one(servicer: FakeActor):
        server, log = start(servicer)
        started.append(server)
        return server, log

    yield start_one
    for server in started:
        server.stop(0)


def test_a_whole_call_is_one_message_from_an_actor_that_answers_whole(servers):
    actor = WholeFake()
    server, log = servers(actor)
    answers, actors = run_calls([server.address], 2)
    for chunks in answers:
        assert len(chunks) == 1 and list(chunks[0].token_ids) == SCRIPT
        assert chunks[0].finish_reason == common_pb2.FINISH_REASON_STOP and chunks[0].actor == "scripted"
    assert log.methods == ["GenerateWhole", "GenerateWhole"]
    assert actors.actors[0].answers_whole and actors.retries == 0


def test_an_actor_without_generate_whole_is_read_as_a_stream_and_asked_once(servers):
    actor = FakeActor("script", SCRIPT)
    server, log = servers(actor)
    answers, actors = run_calls([server.address], 3)
    for chunks in answers:
        assert [t for c in chunks for t in c.token_ids] == SCRIPT and len(chunks) == 3     # its stream, in threes
    assert log.methods == ["GenerateWhole", "Generate", "Generate", "Generate"]
    assert actor.calls == 3 and actors.retries == 0 and actors.actors[0].failures == 0
    assert not actors.actors[0].answers_whole


def test_an_actor_that_fails_before_answering_is_replaced(servers):
    failing, good = WholeFake(fails=True), WholeFake()
    (bad_server, bad_log), (good_server, good_log) = servers(failing), servers(good)
    answers, actors = run_calls([bad_server.address, good_server.address], 1)
    assert len(answers[0]) == 1 and list(answers[0][0].token_ids) == SCRIPT
    assert bad_log.methods == ["GenerateWhole"] and good_log.methods == ["GenerateWhole"]
    assert actors.retries == 1 and actors.by_address[bad_server.address].failures == 1


def test_a_streamed_call_still_streams(servers):
    server, log = servers(WholeFake())
    answers, _ = run_calls([server.address], 1, whole=False)
    assert len(answers[0]) == 3 and log.methods == ["Generate"]


def test_the_first_token_of_a_whole_answer_came_before_its_decoding():
    whole = actor_pb2.GenerateChunk(token_ids=[1, 2], finish_reason=common_pb2.FINISH_REASON_STOP,
                                    timing=common_pb2.Timing(decode_s=0.25))
    assert first_token_s(whole, 1.0) == pytest.approx(0.75)
    assert first_token_s(actor_pb2.GenerateChunk(token_ids=[1], timing=common_pb2.Timing(decode_s=0.25)), 1.0) == 1.0
    assert first_token_s(whole, 0.1) == 0.0
