"""How an agent talks to the model: one ``chat`` call per LLM call. ``GatewayChat`` goes through the gateway (the
call is recorded in the pool for training); ``ActorChat`` renders, samples and parses locally against an actor
(evaluation, nothing recorded). Both return the assistant message exactly as the gateway would, so an agent's
history renders back to the sampled text."""

from __future__ import annotations

import json
from typing import Any, Protocol

import grpc

from forge.agents import Reply
from forge.sampling.params import SamplingParams
from forge.sampling.wire import sampling_to_proto
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2, gateway_pb2, gateway_pb2_grpc


class ChatLLM(Protocol):
    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   sampling: SamplingParams) -> Reply: ...


FINISH = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length",
          common_pb2.FINISH_REASON_ABORT: "abort", common_pb2.FINISH_REASON_ERROR: "error"}


def _proto_messages(messages: list[dict[str, Any]]) -> list[gateway_pb2.ChatMessage]:
    out = []
    for m in messages:
        calls = [gateway_pb2.ToolCall(id=c.get("id", ""), name=c["function"]["name"],
                                      arguments=c["function"]["arguments"]) for c in m.get("tool_calls", [])]
        out.append(gateway_pb2.ChatMessage(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                                           tool_call_id=m.get("tool_call_id", "")))
    return out


def _proto_tools(tools: list[dict[str, Any]] | None) -> list[gateway_pb2.Tool]:
    return [gateway_pb2.Tool(name=t["function"]["name"], description=t["function"].get("description", ""),
                             parameters_json=json.dumps(t["function"].get("parameters", {})))
            for t in tools or []]


class GatewayChat:
    """LLM calls of one session through the gateway's gRPC ChatWhole, each answered as one message (white-box
    agents); a gateway of an older Forge, without it, answers a whole Chat in a stream of one chunk."""

    def __init__(self, stub: gateway_pb2_grpc.GatewayStub, session_id: str, timeout_s: float = 600.0) -> None:
        self.stub = stub
        self.session_id = session_id
        self.timeout_s = timeout_s
        self.answers_whole = True

    async def _answer(self, request: gateway_pb2.ChatRequest) -> gateway_pb2.ChatChunk:
        if self.answers_whole:
            try:
                return await self.stub.ChatWhole(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.answers_whole = False
        request.whole = True
        last = None
        async for chunk in self.stub.Chat(request, timeout=self.timeout_s):
            last = chunk
        if last is None:
            raise RuntimeError("the gateway's Chat stream ended without a reply")
        return last

    async def chat(self, messages, tools, sampling: SamplingParams) -> Reply:
        request = gateway_pb2.ChatRequest(session_id=self.session_id, messages=_proto_messages(messages),
                                          tools=_proto_tools(tools), sampling=sampling_to_proto(sampling))
        last = await self._answer(request)
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in last.tool_calls]
        return Reply(last.content, calls, FINISH.get(last.finish_reason, "stop"), last.call_index,
                     last.completion_tokens, malformed_tool_call=not calls and "<tool_call>" in last.content)


class LocalChat:
    """LLM calls rendered, sampled and parsed here, without the gateway (evaluation): the chat template, the
    tool-call parser and ``_generate`` (token ids in, sampled ids out) — nothing is recorded."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from forge.parsing.completion import CompletionParser

        self.tokenizer = tokenizer
        self.parser = CompletionParser()

    async def _generate(self, prompt: list[int], sampling: SamplingParams) -> tuple[list[int], str]:
        raise NotImplementedError

    async def chat(self, messages, tools, sampling: SamplingParams) -> Reply:
        prompt = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        tokens, finish = await self._generate(prompt, sampling)
        text = self.tokenizer.decode(tokens)
        end = self.tokenizer.special_tokens.get("eos_token")
        if end and text.endswith(end):
            text = text[:-len(end)]
        parsed = self.parser.parse(text, parse_tools=bool(tools), tools=tools)
        calls = [c.to_openai() for c in parsed.tool_calls]
        return Reply(parsed.content, calls, finish, -1, len(tokens),
                     malformed_tool_call=not calls and "<tool_call>" in parsed.content)


class ActorChat(LocalChat):
    """Straight to an actor over gRPC (sampled with its named ``adapter`` when given)."""

    def __init__(self, stub: actor_pb2_grpc.ActorStub, tokenizer: Tokenizer, adapter: str = "") -> None:
        super().__init__(tokenizer)
        self.stub = stub
        self.adapter = adapter

    async def _generate(self, prompt: list[int], sampling: SamplingParams) -> tuple[list[int], str]:
        request = actor_pb2.GenerateRequest(prompt_ids=prompt, sampling=sampling_to_proto(sampling),
                                            adapter=self.adapter)
        answer = await self.stub.GenerateWhole(request, timeout=600)
        return list(answer.token_ids), FINISH.get(answer.finish_reason, "stop")


def aio_channel(address: str, api_key: str | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` that sends ``api_key`` (when given) with every call, streaming ones too."""
    options = [("grpc.max_receive_message_length", 64 * 2**20)]
    if not api_key:
        return grpc.aio.insecure_channel(address, options=options)
    from forge.rpc.auth import bearer_metadata

    key = tuple(bearer_metadata(api_key))

    def with_key(details):
        return details._replace(metadata=(*(details.metadata or ()), *key))

    # One object per kind of call: grpc.aio files each interceptor under the first kind it is an instance of, so
    # one class serving both kinds would never see the streaming calls (Chat, Generate).
    class _UnaryKey(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return await continuation(with_key(details), request)

    class _StreamKey(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, details, request):
            return await continuation(with_key(details), request)

    return grpc.aio.insecure_channel(address, options=options, interceptors=[_UnaryKey(), _StreamKey()])
