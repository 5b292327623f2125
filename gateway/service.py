"""The gateway as one object that both front ends (gRPC and OpenAI HTTP) call: chat and generate, sessions, rewards,
figures, and the background work (session expiry, actor health and discovery). A front end only translates its wire format to
these calls and their results back; who may make a call is ``auth.py``'s. Lives on the gateway's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from forge.gateway.actors import ActorSet
from forge.gateway.async_pool import AsyncPool
from forge.gateway.auth import KeyPolicy
from forge.gateway.calls import CallRunner, ChatDelta, ChatResult
from forge.gateway.config import GatewayConfig
from forge.gateway.errors import BadRequest, GatewayError, NotFound
from forge.gateway.grammar_check import GrammarCheck
from forge.gateway.keys import KeyRing
from forge.gateway.messages import ChatCall, check_sampling
from forge.gateway.metrics import Metrics
from forge.gateway.modelinfo import ModelInfo
from forge.gateway.off_loop import MEMORY_BYTES, OffLoop
from forge.gateway.sessions import SessionRegistry
from forge.parsing.completion import CompletionParser, pick_tool_parser
from forge.parsing.reasoning import pick_reasoning_parser
from forge.telemetry import stats_report
from forge.v1 import actor_pb2, common_pb2, pool_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")
# What the front ends run in the decoding process (forge.gateway.off_loop), imported as it starts.
DECODING_MODULES = ("forge.gateway.http.decode",)


@dataclass(frozen=True)
class CallStream(Generic[T]):
    """A call under way: its session (known before the first event) and its events."""

    session_id: str
    events: AsyncIterator[T]


def sample_call(call: ChatCall, index: int) -> ChatCall:
    """The call of answer ``index`` of several to one prompt: a seeded one draws with seed + index."""
    if index == 0 or not call.sampling.HasField("seed"):
        return call
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(call.sampling)
    sampling.seed = (call.sampling.seed + index) % (2**63)
    return dataclasses.replace(call, sampling=sampling)


def _required(session_id: str | None) -> str:
    if not session_id:
        raise BadRequest("session_id is required (StartSession gives one)", "session_id")
    return session_id


class Gateway:
    def __init__(self, config: GatewayConfig, pool: Any, model: ModelInfo) -> None:
        self.config = config
        self.model = model
        self.metrics = Metrics()
        self.keys = KeyRing(config.api_keys, config.session_key_secret)
        self.policy = KeyPolicy(self.keys)
        self.pool = AsyncPool(pool)
        self.actors = ActorSet(config.actors, config.router, config.session_affinity, config.actor_api_key,
                               config.health_interval_s, config.prefill_actors, config.prefill_min_tokens,
                               config.actors_dir, config.discovery_interval_s, config.drop_after_s,
                               adapter=config.adapter or "")
        self.sessions = SessionRegistry(self.pool, self.keys, self.metrics, config.tito_max_calls,
                                        config.fail_sessions_on_call_error)
        self.sessions.on_forget.append(self.actors.router.forget)
        self.parser = CompletionParser(self._tool_parser(), self._reasoning_parser())
        self.work = OffLoop(memory_bytes=max(MEMORY_BYTES, 64 * config.max_body_bytes), preload=DECODING_MODULES)
        self.grammars = GrammarCheck.of_model(model, config.grammar_memory_mb, config.grammar_timeout_s)
        self.runner = CallRunner(model, self.actors, self.sessions, self.parser, self.metrics, self.work)
        self.http_url = ""          # set once the HTTP server is bound, e.g. http://127.0.0.1:8000
        self.grpc_address = ""
        self.instance = "gateway"
        self.started = time.time()
        self._expiry: asyncio.Task | None = None

    async def start(self) -> None:
        await self.actors.start()
        self._expiry = asyncio.create_task(self._expire_forever(), name="session-expiry")

    async def close(self) -> None:
        if self._expiry:
            self._expiry.cancel()
        await self.actors.close()
        self.work.close()
        self.grammars.close()

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.expiry_every_s())
            try:
                expired = await self.sessions.expire(self.config.session_timeout_s)
                if expired:
                    log.info("expired %d idle sessions as failed", len(expired))
            except GatewayError as exc:
                log.warning("session expiry failed: %s", exc.message)

    def _tool_parser(self) -> str:
        """The configured tool-call parser, or with ``auto`` the one the model's chat template (or type) calls for."""
        if self.config.tool_parser != "auto":
            return self.config.tool_parser
        name, why = pick_tool_parser(self.model.tokenizer.chat_template, self.model.model_type)
        log.info("tool-call parser: %s (%s)", name, why)
        return name

    def _reasoning_parser(self) -> str:
        """The configured reasoning parser, or with ``auto`` the one the model's chat template calls for."""
        if self.config.reasoning_parser != "auto":
            return self.config.reasoning_parser
        name, why = pick_reasoning_parser(self.model.tokenizer.chat_template)
        log.info("reasoning parser: %s (%s)", name, why)
        return name

    def base_url(self, session_id: str | None = None) -> str:
        if session_id is None:
            return f"{self.http_url}/v1"
        return f"{self.http_url}/s/{quote(session_id, safe='')}/v1"

    async def chat(self, call: ChatCall, session_id: str | None, open_as: pool_pb2.OpenSessionRequest | None = None,
                   stream: bool = True, size: int = 0) -> CallStream[ChatDelta | ChatResult]:
        """Render ``call`` with the chat template and run it in session ``session_id``: deltas (with ``stream``),
        then the result once the call is recorded. With ``open_as``, an unknown session is opened with its fields
        at the call's first record, and no ``session_id`` means a new one-call session; without, it must exist.
        ``size``: bytes of the request the call came from; a large one is checked and rendered off the loop."""
        return (await self.chat_samples(call, 1, session_id, open_as, stream, size))[0]

    async def chat_samples(self, call: ChatCall, samples: int, session_id: str | None,
                           open_as: pool_pb2.OpenSessionRequest | None = None, stream: bool = True, size: int = 0
                           ) -> list[CallStream[ChatDelta | ChatResult]]:
        """``samples`` answers to one prompt, run at once as ``chat`` runs one, each recorded as a call of the
        session (with a seed, answer i is drawn with seed + i). A one-call session of their own is closed once the
        last of them ends."""
        if open_as is None:
            _required(session_id)
        prompt = await self.work.run(size, self.runner.render, call)
        await self.grammars.check(call.sampling, call.grammar_param)
        state = await self.sessions.resolve(session_id or uuid.uuid4().hex, open_as)
        streams = [self.runner.chat(state, sample_call(call, i), prompt, stream) for i in range(samples)]
        if session_id is None:
            streams = self._closing_after_all(state.session_id, streams)
        return [CallStream(state.session_id, events) for events in streams]

    def call_unanswered(self, session_id: str, reason: str) -> None:
        """A recorded call of ``session_id`` whose answer could not be sent: the session has a failed call (it is
        closed as failed, as after an actor's failure mid-call)."""
        self.metrics.count("unanswered_calls")
        state = self.sessions.sessions.get(session_id)
        if state is not None:
            state.failures.append(reason)

    async def prompt_tokens(self, call: ChatCall, size: int = 0) -> int:
        """How many tokens ``call``'s prompt is, rendered as it would run (nothing is sampled or recorded)."""
        prompt = await self.work.run(size, self.runner.render, call)
        return len(await self.work.run(len(prompt.text), self.model.tokenizer.encode, prompt.text))

    def _closing_after_all(self, session_id: str, streams: list[AsyncIterator[T]]) -> list[AsyncIterator[T]]:
        """The calls' events; once the last of them has ended, the session they opened for themselves is closed (as
        failed: no agent is there to give it an outcome), so that it does not hold the learner's queue until it
        times out."""
        left = len(streams)

        async def closing(events: AsyncIterator[T]) -> AsyncIterator[T]:
            nonlocal left
            try:
                async for event in events:
                    yield event
            finally:
                left -= 1
                if left == 0:
                    await asyncio.shield(self._close_one_call(session_id))

        return [closing(events) for events in streams]

    async def _close_one_call(self, session_id: str) -> None:
        request = pool_pb2.CloseSessionRequest(session_id=session_id, failed=True,
                                               failure_reason="a call outside any session: no outcome will come")
        try:
            await self.sessions.end(request)
        except NotFound:                     # the call was refused before anything was recorded
            self.sessions.forget(session_id)
        except GatewayError as exc:
            log.warning("could not close the one-call session %s: %s", session_id, exc.message)

    async def generate(self, session_id: str | None, prompt_ids: Sequence[int], sampling: common_pb2.SamplingParams,
                       whole: bool = False) -> CallStream[tuple[actor_pb2.GenerateChunk, int | None]]:
        """Token-level generation in an existing session, recorded as a call: the actor's chunks, the last with
        the call's index; ``whole``: one chunk, the whole completion."""
        session = _required(session_id)
        checked = await self.work.run(sampling.ByteSize(), check_sampling, sampling, self.model.vocab_size,
                                      self.model.context_length)
        await self.grammars.check(checked, "grammar")
        state = await self.sessions.resolve(session)
        return CallStream(state.session_id, self.runner.generate(state, prompt_ids, checked, whole))

    async def start_session(self, request: pool_pb2.OpenSessionRequest, issue_key: bool
                            ) -> tuple[pool_pb2.SessionRecord, str | None, str]:
        record, key = await self.sessions.start(request, issue_key)
        return record, key, self.base_url(record.session_id)

    async def end_session(self, request: pool_pb2.CloseSessionRequest) -> pool_pb2.SessionRecord:
        _required(request.session_id)
        for name, values in (("outcome_rewards", request.outcome_rewards), ("metrics", request.metrics)):
            if not all(math.isfinite(v) for v in values.values()):
                raise BadRequest(f"{name} must be finite numbers", name)
        return await self.sessions.end(request)

    async def add_reward(self, session_id: str, call_index: int, reward: float) -> None:
        _required(session_id)
        if not math.isfinite(reward):
            raise BadRequest("reward must be a finite number", "reward")
        await self.pool.add_process_reward(session_id, call_index, reward)

    async def get_session(self, session_id: str) -> pool_pb2.SessionWithCalls:
        return await self.pool.get_session(session_id)

    def gauges(self) -> dict[str, float]:
        figures = self.metrics.gauges()
        figures.update(self.actors.gauges())
        figures.update(self.grammars.gauges())
        figures["sessions_open"] = float(self.sessions.open_count())
        figures["sessions_in_memory"] = float(len(self.sessions.sessions))
        return figures

    def report(self) -> common_pb2.StatsReport:
        labels = {"model": self.model.model_id, "model_name": self.config.model_name,
                  "router": self.config.router + ("+affinity" if self.config.session_affinity else ""),
                  "http_url": self.http_url, "grpc_address": self.grpc_address}
        if self.config.actors_dir is not None:
            labels["actors_dir"] = str(self.config.actors_dir)
        return stats_report("gateway", self.instance, self.started, self.gauges(), labels)
