"""The load harness's agents: client processes that hold multi-turn sessions open on one path (direct to the actor;
chat, Messages, gRPC chat or token-level Generate through a gateway; or chat through a LiteLLM proxy) and count what
they see. Each session opens with a user turn of about ``Load.prompt_tokens`` tokens, begun with words naming the
measurement's run (so no path is served from the prefix cache another path filled), and after each call adds the
reply and a new user turn. ``bench/gateway_load.py`` and ``bench/gateway_soak.py`` run them in processes of their
own (``run_client``)."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field

from litellm_proxy import SESSION_HEADER, LiteLLMProxy

HTTP_PATHS = ("chat", "messages", "litellm")
FILLER = ("the quick brown fox jumps over a lazy dog while seven wizards quietly box jugs of liquid gold and "
          "every sentence counts its words ")


@dataclass(frozen=True)
class Load:
    """One client process's share: sessions ``first`` .. ``first + count - 1`` on ``path``."""

    path: str
    first: int
    count: int
    calls: int
    prompt_tokens: int
    max_tokens: int
    think_s: float
    targets: dict[str, list[str]]       # path -> the addresses its sessions spread over
    run: str
    until: float = 0.0                  # time.time() until which each session slot starts new sessions (0: one each)
    end_sessions: bool = False          # end each session after its calls, as an agent's driver does


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)     # time.time() at each call's answer
    failures: list[str] = field(default_factory=list)
    new_tokens: int = 0                 # prompt tokens each call added to its session's context, and completions
    wall_s: float = 0.0
    cpu_s: float = 0.0                  # the client process's own (building prompts on the direct path)

    def count(self, prompt: int, completion: int, before: int) -> int:
        """Count a call's new tokens: those of its prompt past the session's context ``before`` (the previous call's
        prompt and completion) and its completion; the context after it."""
        self.new_tokens += (prompt - before if prompt >= before else prompt) + completion
        return prompt + completion

    def answered(self, started: float) -> None:
        self.latencies.append(time.perf_counter() - started)
        self.ended.append(time.time())


@functools.cache
def tokens_per_word() -> float:
    """How many tokens the tiny model's tokenizer makes of a word of the filler text."""
    from forge.assets import TINY_DIR
    from forge.tokenizer import Tokenizer

    text = FILLER * 20
    return len(Tokenizer.from_dir(TINY_DIR).encode(text)) / len(text.split())


@functools.cache
def one_token_words() -> tuple[str, ...]:
    """Words the tiny model's tokenizer makes one token of (after a space), from its vocabulary."""
    from forge.assets import TINY_DIR
    from forge.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(TINY_DIR)
    pieces = (tokenizer.decode([i]) for i in range(tokenizer.vocab_size))
    return tuple(sorted({p[1:] for p in pieces if p[:1] == " " and p[1:].isalpha() and p[1:].islower()
                         and len(tokenizer.encode(p)) == 1}))


def run_tag(run: str) -> str:
    """Words naming measurement ``run``, as many tokens whatever the run: each path's prompts differ from the others'
    from their first words, so no path finds its prompts in the actor's prefix cache from an earlier path's calls."""
    words = one_token_words()
    number = int(run, 16)
    return " ".join(words[(number >> (8 * k)) % len(words)] for k in range(4))


def opening(session: int, tokens: int, run: str) -> str:
    """A first user turn of about ``tokens`` tokens."""
    words = FILLER.split()
    count = max(round((tokens - 8) / tokens_per_word()), 1)
    return f"Run {run_tag(run)}, session {session}: " + " ".join(words[i % len(words)] for i in range(count))


async def _session_http(http, base: str, path: str, sid: str, s: int, load: Load, outcome: Outcome) -> None:
    if path == "litellm":                   # the proxy's route; the session goes to the gateway in a header
        url, headers = f"{base}/v1/chat/completions", {**LiteLLMProxy.client_headers(), SESSION_HEADER: sid}
        gateways = load.targets["chat"]
        base, path = gateways[s % len(gateways)], "chat"        # ended at the gateway; answered as chat's
    else:
        url, headers = f"{base}/s/{sid}/v1/" + ("chat/completions" if path == "chat" else "messages"), {}
    messages = [{"role": "user", "content": opening(s, load.prompt_tokens, load.run)}]
    context = 0
    for c in range(load.calls):
        body = {"model": "forge-tiny", "messages": messages, "max_tokens": load.max_tokens, "temperature": 1.0}
        body |= {"seed": s * 1000 + c} if path == "chat" else {"metadata": {"user_id": sid}}
        started = time.perf_counter()
        async with http.post(url, json=body, headers=headers) as response:
            answer = await response.json(content_type=None)
        outcome.answered(started)
        if response.status != 200:
            outcome.failures.append(f"{path} HTTP {response.status}: {str(answer)[:200]}")
            return
        if path == "chat":
            reply, usage = answer["choices"][0]["message"]["content"] or "", answer["usage"]
            context = outcome.count(usage["prompt_tokens"], usage["completion_tokens"], context)
        else:
            reply, usage = "".join(block.get("text", "") for block in answer["content"]), answer["usage"]
            context = outcome.count(usage["input_tokens"], usage["output_tokens"], context)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Turn {c}: go on."}]
        if load.think_s:
            await asyncio.sleep(load.think_s)
    if load.end_sessions:
        async with http.post(f"{base}/v1/sessions/{sid}/end", json={"outcome_rewards": {"load": 1.0}}) as response:
            if response.status != 200:
                outcome.failures.append(f"{path} end HTTP {response.status}: {(await response.text())[:200]}")


async def _session_grpc(stub, s: int, load: Load, outcome: Outcome, whole: bool) -> None:
    from forge.v1 import common_pb2, gateway_pb2

    sid = (await stub.StartSession(gateway_pb2.StartSessionRequest(task_id="load"))).session.session_id
    messages = [gateway_pb2.ChatMessage(role="user", content=opening(s, load.prompt_tokens, load.run))]
    context = 0
    for c in range(load.calls):
        sampling = common_pb2.SamplingParams(temperature=1.0, seed=s * 1000 + c, max_tokens=load.max_tokens)
        started = time.perf_counter()
        request = gateway_pb2.ChatRequest(session_id=sid, messages=messages, sampling=sampling)
        if whole:
            last = await stub.ChatWhole(request)
            reply = [last.text]
        else:
            reply = []
            async for chunk in stub.Chat(request):
                reply.append(chunk.text)
                last = chunk
        outcome.answered(started)
        context = outcome.count(last.prompt_tokens, last.completion_tokens, context)
        messages += [gateway_pb2.ChatMessage(role="assistant", content="".join(reply)),
                     gateway_pb2.ChatMessage(role="user", content=f"Turn {c}: go on.")]
        if load.think_s:
            await asyncio.sleep(load.think_s)
    if load.end_sessions:
        await stub.EndSession(gateway_pb2.EndSessionRequest(session_id=sid, outcome_rewards={"load": 1.0}))


async def _session_tokens(stub, tokenizer, s: int, load: Load, outcome: Outcome, through_gateway: bool) -> None:
    """A session whose client builds its prompt ids itself (as the gateway builds them: the earlier calls' ids
    reused) and sends them to the actor's Generate (direct) or to the gateway's (a white-box agent), answered whole."""
    from forge.gateway.tito import CallHistory
    from forge.v1 import actor_pb2, common_pb2, gateway_pb2

    sid = ""
    if through_gateway:
        sid = (await stub.StartSession(gateway_pb2.StartSessionRequest(task_id="load"))).session.session_id
    messages = [{"role": "user", "content": opening(s, load.prompt_tokens, load.run)}]
    history = CallHistory()
    context = 0
    for c in range(load.calls):
        sampling = common_pb2.SamplingParams(temperature=1.0, seed=s * 1000 + c, max_tokens=load.max_tokens)
        text = tokenizer.render_chat(messages, add_generation_prompt=True)
        prompt = history.build(tokenizer, text, has_history=c > 0).ids
        started = time.perf_counter()
        ids: list[int] = []
        if through_gateway:
            request = gateway_pb2.SessionGenerateRequest(session_id=sid, prompt_ids=prompt, sampling=sampling)
            ids += (await stub.GenerateWhole(request)).token_ids
        else:
            ids += (await stub.GenerateWhole(actor_pb2.GenerateRequest(prompt_ids=prompt, sampling=sampling))).token_ids
        outcome.answered(started)
        context = outcome.count(len(prompt), len(ids), context)
        history.add(c, prompt, ids)
        messages += [{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)},
                     {"role": "user", "content": f"Turn {c}: go on."}]
        if load.think_s:
            await asyncio.sleep(load.think_s)
    if through_gateway and load.end_sessions:
        await stub.EndSession(gateway_pb2.EndSessionRequest(session_id=sid, outcome_rewards={"load": 1.0}))


async def _client(load: Load) -> Outcome:
    import aiohttp
    import grpc

    from forge.assets import TINY_DIR
    from forge.tokenizer import Tokenizer
    from forge.v1 import actor_pb2_grpc, gateway_pb2_grpc

    outcome = Outcome()
    addresses = load.targets[load.path]
    sessions = range(load.first, load.first + load.count)

    async def guarded(session, s: int) -> None:
        """Session slot ``s``: one session, or new ones until ``load.until``."""
        cycle = 0
        while True:
            try:
                await session(s, f"load-{load.run}-{s}" + (f"-{cycle}" if cycle else ""))
            except Exception as exc:                # a failed session is counted, the others go on
                outcome.failures.append(f"{load.path}: {type(exc).__name__}: {exc}"[:300])
            cycle += 1
            if time.time() >= load.until:
                return

    started, cpu_started = time.perf_counter(), time.process_time()
    if load.path in HTTP_PATHS:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as http:
            def session(s: int, sid: str):
                return _session_http(http, addresses[s % len(addresses)], load.path, sid, s, load, outcome)

            await asyncio.gather(*(guarded(session, s) for s in sessions))
    else:
        channels = [grpc.aio.insecure_channel(a, options=[("grpc.max_concurrent_streams", 1 << 20)])
                    for a in addresses]
        try:
            if load.path.startswith("grpc"):
                stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
                whole = load.path == "grpc"
                await asyncio.gather(*(guarded(lambda s, sid: _session_grpc(stubs[s % len(stubs)], s, load, outcome,
                                                                            whole), s) for s in sessions))
            else:
                tokenizer = Tokenizer.from_dir(TINY_DIR)
                through_gateway = load.path == "generate"
                stubs = [(gateway_pb2_grpc.GatewayStub if through_gateway else actor_pb2_grpc.ActorStub)(c)
                         for c in channels]
                await asyncio.gather(*(guarded(lambda s, sid: _session_tokens(stubs[s % len(stubs)], tokenizer, s,
                                                                              load, outcome, through_gateway), s)
                                       for s in sessions))
        finally:
            for channel in channels:
                await channel.close()
    outcome.wall_s = time.perf_counter() - started
    outcome.cpu_s = time.process_time() - cpu_started
    return outcome


def run_client(load: Load) -> Outcome:
    return asyncio.run(_client(load))
