"""The floor under the gateway's CPU per call: what its two servers (aiohttp for the HTTP APIs, ``grpc.aio`` for the
gRPC API) and its gRPC client to the actors cost a call when the handler does nothing but decode the request and
answer, measured as the gateway sees them (a chat-sized request, Forge's request-decoding interceptor on the gRPC
server, a non-streaming answer; the gRPC client reading an actor's non-streaming answer as one message, as the
gateway reads it from GenerateWhole, and as the two-message stream an actor of an older Forge answers).

The server runs in a process of its own and the client in this one; each side's CPU seconds over --calls calls with
--concurrency in flight give its CPU per call. Compare with ``bench/gateway_load.py``'s gateway CPU per call: the
difference is the gateway's own work (rendering, token-in-token-out, recording, routing).

Usage: python bench/transport_floor.py [--calls 4096] [--concurrency 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import resource
import statistics

from procfs import cpu_s

from forge.v1 import common_pb2, gateway_pb2

MESSAGES = [{"role": "user", "content": "x" * 1500}] + [{"role": "assistant", "content": "y" * 150},
                                                          {"role": "user", "content": "z" * 20}] * 8
BODY = {"model": "forge-tiny", "messages": MESSAGES, "max_tokens": 32}
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "usage": {"prompt_tokens": 700, "completion_tokens": 32},
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "w" * 150}, "finish_reason": "length"}]}
REQUEST = gateway_pb2.ChatRequest(session_id="s", messages=[gateway_pb2.ChatMessage(**m) for m in MESSAGES])
CHUNKS = [gateway_pb2.ChatChunk(token_ids=[7]), gateway_pb2.ChatChunk(text="w" * 150, token_ids=list(range(31)),
                                                                     logprobs=[-0.5] * 31,
                                                                     finish_reason=common_pb2.FINISH_REASON_LENGTH)]
WHOLE = gateway_pb2.ChatChunk()
for _chunk in CHUNKS:
    WHOLE.MergeFrom(_chunk)
METHOD = "/forge.bench.Floor/Chat"
WHOLE_METHOD = "/forge.bench.Floor/ChatWhole"


def _serve_http(ready, _actor_like: bool = False) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        json.loads(await request.read())
        return web.json_response(ANSWER)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_grpc(ready, actor_like: bool = False) -> None:
    """The gRPC API's server: Forge's decoding interceptor, the request decoded, one chunk back. ``actor_like``: as an
    actor answers a non-streaming call instead, the request left undecoded and two chunks back."""
    import grpc

    from forge.rpc.decoding import AioDecodeInterceptor

    async def chat(request: object, context: grpc.aio.ServicerContext):
        for chunk in CHUNKS if actor_like else CHUNKS[-1:]:
            yield chunk

    async def chat_whole(request: object, context: grpc.aio.ServicerContext):
        return WHOLE

    async def main() -> None:
        server = grpc.aio.server(interceptors=[] if actor_like else [AioDecodeInterceptor()])
        handler = grpc.unary_stream_rpc_method_handler(chat, None if actor_like else gateway_pb2.ChatRequest.FromString,
                                                       gateway_pb2.ChatChunk.SerializeToString)
        whole = grpc.unary_unary_rpc_method_handler(chat_whole, None, gateway_pb2.ChatChunk.SerializeToString)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("forge.bench.Floor",
                                                                              {"Chat": handler, "ChatWhole": whole})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put(port)
        await server.wait_for_termination()

    asyncio.run(main())


async def _http_calls(port: int, calls: int, concurrency: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def worker() -> None:
            for _ in range(calls // concurrency):
                async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=BODY) as response:
                    await response.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _grpc_calls(port: int, calls: int, concurrency: int, whole: bool = False) -> None:
    """``calls`` gRPC calls, ``concurrency`` in flight, each answer read as a stream or (``whole``) one message."""
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        serialize, deserialize = gateway_pb2.ChatRequest.SerializeToString, gateway_pb2.ChatChunk.FromString
        if whole:
            call = channel.unary_unary(WHOLE_METHOD, request_serializer=serialize, response_deserializer=deserialize)
        else:
            stream = channel.unary_stream(METHOD, request_serializer=serialize, response_deserializer=deserialize)

        async def worker() -> None:
            for _ in range(calls // concurrency):
                if whole:
                    await call(REQUEST)
                else:
                    async for _chunk in stream(REQUEST):
                        pass

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(serve, actor_like: bool, calls_of, calls: int, concurrency: int) -> tuple[float, float]:
    """(server, client) CPU ms per call."""
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    server = context.Process(target=serve, args=(ready, actor_like), daemon=True)
    server.start()
    try:
        port = ready.get(timeout=120)
        asyncio.run(calls_of(port, min(calls, 512), concurrency))          # warm up
        server_before, client_before = cpu_s(server.pid), _own_cpu_s()
        asyncio.run(calls_of(port, calls, concurrency))
        made = calls // concurrency * concurrency
        return ((cpu_s(server.pid) - server_before) * 1e3 / made, (_own_cpu_s() - client_before) * 1e3 / made)
    finally:
        server.kill()
        server.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.calls < args.concurrency or args.concurrency < 1 or args.repeats < 1:
        parser.error("--calls must be at least --concurrency, which must be at least 1; --repeats at least 1")
    cases = {"aiohttp server (HTTP APIs)": (_serve_http, False, _http_calls, 0),
             "grpc.aio server (gRPC API)": (_serve_grpc, False, _grpc_calls, 0),
             "grpc.aio client, one message": (_serve_grpc, True, functools.partial(_grpc_calls, whole=True), 1),
             "grpc.aio client, a stream": (_serve_grpc, True, _grpc_calls, 1)}
    print(f"CPU ms a call, medians of {args.repeats} runs of {args.calls} calls, {args.concurrency} in flight")
    for name, (serve, actor_like, calls_of, side) in cases.items():
        runs = [measure(serve, actor_like, calls_of, args.calls, args.concurrency)[side] for _ in range(args.repeats)]
        print(f"{name:32s} {statistics.median(runs):6.3f}  (runs: {', '.join(f'{r:.3f}' for r in runs)})")


if __name__ == "__main__":
    main()
