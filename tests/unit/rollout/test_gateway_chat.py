"""A white-box agent's calls through the gateway (``forge.rollout.llm.GatewayChat``), against real in-process gRPC
servers: each call is answered as one message (ChatWhole); a gateway of an older Forge, without ChatWhole, is asked
for it once and then answered through a whole Chat. (The real gateway's ChatWhole:
integration/gateway/test_gateway_grpc.py.)"""

from __future__ import annotations

import asyncio

from forge.rollout.llm import GatewayChat, aio_channel
from forge.rpc import ServiceBinding, serve
from forge.sampling.params import SamplingParams
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from helpers.method_log import MethodLog


def answer(request: gateway_pb2.ChatRequest, calls: int) -> gateway_pb2.ChatChunk:
    """The reply of call ``calls`` of a session: the last message echoed."""
    echoed = request.messages[-1].content.upper()
    return gateway_pb2.ChatChunk(text=echoed, content=echoed,
                                 finish_reason=common_pb2.FINISH_REASON_STOP, call_index=calls, completion_tokens=3)


class OlderGateway(gateway_pb2_grpc.GatewayServicer):
    """A gateway of a Forge before ChatWhole: Chat answers a whole call in one chunk (the generated base class answers
    ChatWhole UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.requests: list[gateway_pb2.ChatRequest] = []

    def Chat(self, request, context):
        self.requests.append(request)
        yield answer(request, len(self.requests) - 1)


class CurrentGateway(OlderGateway):
    def ChatWhole(self, request, context):
        self.requests.append(request)
        return answer(request, len(self.requests) - 1)


def chat_twice(servicer: OlderGateway) -> tuple[list, list[str], GatewayChat]:
    log = MethodLog("forge.v1.Gateway")
    server = serve([ServiceBinding.of(gateway_pb2_grpc.add_GatewayServicer_to_server, servicer, gateway_pb2,
                                      "Gateway")], interceptors=[log])

    async def run() -> tuple[list, GatewayChat]:
        async with aio_channel(server.address) as channel:
            chat = GatewayChat(gateway_pb2_grpc.GatewayStub(channel), "s-1")
            replies = [await chat.chat([{"role": "user", "content": text}], None, SamplingParams(max_tokens=3))
                       for text in ("first", "second")]
            return replies, chat

    try:
        replies, chat = asyncio.run(run())
    finally:
        server.stop(0)
    return replies, log.methods, chat


def test_each_call_is_answered_as_one_message():
    servicer = CurrentGateway()
    replies, methods, chat = chat_twice(servicer)
    assert methods == ["ChatWhole", "ChatWhole"] and chat.answers_whole
    assert [(r.content, r.call_index, r.finish_reason) for r in replies] == [("FIRST", 0, "stop"),
                                                                             ("SECOND", 1, "stop")]
    assert [r.session_id for r in servicer.requests] == ["s-1", "s-1"]


def test_an_older_gateway_is_asked_once_then_answered_through_a_whole_chat():
    servicer = OlderGateway()
    replies, methods, chat = chat_twice(servicer)
    assert methods == ["ChatWhole", "Chat", "Chat"] and not chat.answers_whole
    assert [(r.content, r.call_index) for r in replies] == [("FIRST", 0), ("SECOND", 1)]
    assert all(r.whole and r.session_id == "s-1" for r in servicer.requests)
