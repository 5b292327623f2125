"""The rollout driver's asyncio channel to a keyed gateway: the key goes with every call, the streaming Chat and
Generate included (white-box agents stream their calls), and a channel without it is refused."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from forge.rollout.llm import aio_channel
from forge.v1 import gateway_pb2, gateway_pb2_grpc

KEY = "rollout-key-1"
GATEWAY_ARGS = ("--api-key", KEY)          # the stack fixture's gateway (conftest.py) is keyed


async def one_chat(address: str, api_key: str | None) -> list[gateway_pb2.ChatChunk]:
    async with aio_channel(address, api_key) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        started = await stub.StartSession(gateway_pb2.StartSessionRequest(task_id="keyed"), timeout=60)
        request = gateway_pb2.ChatRequest(session_id=started.session.session_id)
        request.messages.add(role="user", content="hello")
        request.sampling.max_tokens = 3
        return [chunk async for chunk in stub.Chat(request, timeout=60)]


def test_the_key_goes_with_streaming_calls_too(stack):
    chunks = asyncio.run(one_chat(stack.gateway.grpc_address, KEY))
    assert sum(len(c.token_ids) for c in chunks) == 3 and chunks[-1].completion_tokens == 3


def test_a_channel_without_the_key_is_refused(stack):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(one_chat(stack.gateway.grpc_address, None))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
