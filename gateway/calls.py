"""One LLM call, from prompt to pool record: build the prompt ids (token-in-token-out), stream from an actor, turn
ids into text deltas (stop strings, reasoning, tool calls), and append the call to the pool before the caller
sends its last message. Used by both front ends."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from forge import expert_routing
from forge.gateway.actor_calls import ActorCall, first_token_s
from forge.gateway.actors import ActorSet
from forge.gateway.detokenize import TextAssembler
from forge.gateway.errors import BadRequest, UpstreamFailed
from forge.gateway.forced_calls import tool_call_opener
from forge.gateway.messages import ChatCall
from forge.gateway.metrics import Metrics
from forge.gateway.modelinfo import ModelInfo
from forge.gateway.off_loop import OffLoop
from forge.gateway.routing import RouteRequest
from forge.gateway.sessions import SessionRegistry, SessionState
from forge.gateway.tito import FALLBACK, FRESH, PARTIAL, SPLICE
from forge.gateway.tool_grammar import (
    LarkText,
    call_layout,
    forced_call_lark,
    is_strict,
    reply_or_call_lark,
    reply_schema,
)
from forge.parsing.completion import CompletionParser, ParsedCompletion
from forge.pool import InvalidRequestError, check_call
from forge.sampling.grammar import json_lark
from forge.tokenizer import ChatTemplateError, RenderLimitExceeded
from forge.v1 import actor_pb2, common_pb2, pool_pb2

log = logging.getLogger(__name__)

TITO_COUNTERS = {FRESH: "tito_fresh", SPLICE: "tito_splices", PARTIAL: "tito_partial", FALLBACK: "tito_fallbacks"}
STOP, LENGTH, ABORT = common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_ABORT


@dataclass
class Completion:
    """What an actor's stream has produced so far: token ids with their log-probs and versions, the answering actor,
    and the time to the first token."""

    t0: float
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)
    actor: str = ""
    ttft: float | None = None

    def add(self, chunk: actor_pb2.GenerateChunk) -> None:
        if self.ttft is None and chunk.token_ids:
            self.ttft = first_token_s(chunk, time.monotonic() - self.t0)
        self.actor = chunk.actor or self.actor
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        self.versions.extend(chunk.weight_versions)
        self.top_logprobs.extend(chunk.top_logprobs)


@dataclass(frozen=True)
class Prompt:
    """What the model continues: the rendered chat, ending with ``opener``, the forced beginning of the answer
    (a forced tool call's, or empty). ``lead`` is the opening tag of a reasoning block the rendered chat left open
    for the answer to continue (templates that start the model's thinking, see ``forge.parsing.reasoning``), or
    empty. Both are parsed together with what is sampled after them (``answer_start``)."""

    text: str
    opener: str = ""
    lead: str = ""

    @property
    def answer_start(self) -> str:
        return self.lead + self.opener


@dataclass
class ChatDelta:
    """New text of a running call: raw text, and the same split into reasoning and content."""

    text: str = ""
    reasoning: str = ""
    content: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)    # per token, when asked for


@dataclass
class ChatResult(ChatDelta):
    """The last event of a call, sent once it is recorded: the remaining deltas and the whole completion."""

    finish_reason: int = STOP
    stopped_by_string: bool = False
    stop_string: str | None = None              # the stop string that ended the call, if one did
    parsed: ParsedCompletion | None = None
    call_index: int = -1
    session_id: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    all_logprobs: list[float] = field(default_factory=list)
    all_top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)
    all_weight_versions: list[int] = field(default_factory=list)
    tito: str = ""


def routing_of(last: actor_pb2.GenerateChunk, prompt_tokens: int, out: Completion) -> common_pb2.ExpertRouting | None:
    """The routing record a call keeps: the actor's, when it covers exactly the positions the call fed (all but
    its last token); None otherwise (a dense model, or a record that does not fit, which is logged)."""
    if not last.HasField("routed_experts") or not out.token_ids:
        return None
    covered, fed = expert_routing.positions(last.routed_experts), prompt_tokens + len(out.token_ids) - 1
    if covered != fed:
        log.warning("the actor's routing record covers %d positions, the call fed %d; not kept", covered, fed)
        return None
    return last.routed_experts


def ids_field(ids: Sequence[int]) -> Sequence[int]:
    """``ids`` as a protobuf repeated field, converted once: the actor's request and the pool's record each copy a
    field at C speed, where each would convert a list a Python object at a time."""
    return actor_pb2.GenerateRequest(prompt_ids=ids).prompt_ids


def _grow(old: str, new: str, what: str) -> str:
    if new.startswith(old):
        return new[len(old):]
    log.warning("streamed %s is not a prefix of the final one; sending the difference only", what)
    return ""


class CallRunner:
    def __init__(self, model: ModelInfo, actors: ActorSet, sessions: SessionRegistry, parser: CompletionParser,
                 metrics: Metrics, work: OffLoop | None = None) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.actors = actors
        self.sessions = sessions
        self.parser = parser
        self.metrics = metrics
        self.work = work or OffLoop()
        self._lark_text: LarkText | None = None

    def check_size(self, call: ChatCall) -> None:
        """Refuse, before any rendering, a call whose message text alone cannot fit the context."""
        self.model.limits.check_size(call)

    def render(self, call: ChatCall) -> Prompt:
        """The prompt of a chat call (the template with the generation prompt, and a forced tool call's opener),
        refused as too long as soon as its text cannot fit the context, before it is tokenised."""
        self.check_size(call)
        text = self._render(call, call.messages, add_generation_prompt=True)
        render = functools.partial(self._render, call)
        opener = tool_call_opener(render, call.messages, text, call.forced_function, call.tools) \
            if call.force_tool_call else ""
        self._constrain_tool_calls(call, render, text)
        return Prompt(text + opener, opener, self.parser.opened_reasoning(text))

    def _constrain_tool_calls(self, call: ChatCall, render: Callable[..., str], prompt: str) -> None:
        """Give the call the grammar its tools need (``forge.gateway.tool_grammar``): a forced call to a strict
        function follows its schema, and a reply held to a response format may still be a tool call."""
        forced = call.force_tool_call
        if not call.parse_tools or not (call.sampling.HasField("grammar") or forced):
            return
        if forced and not any(is_strict(tool) for tool in call.tools or ()):
            return
        layout = call_layout(render, call.messages, prompt, call.tools or [], self.model.end_texts)
        if self._lark_text is None:
            added = self.tokenizer.backend.get_added_tokens_decoder()
            self._lark_text = LarkText({token.content: token_id for token_id, token in added.items()})
        if forced:
            lark = forced_call_lark(layout, call.tools or [], call.forced_function, self._lark_text)
            call.grammar_param = "tools"
        else:
            lark = reply_or_call_lark(json_lark(reply_schema(call.sampling.grammar)), layout, call.tools or [],
                                      self._lark_text)
        if lark is not None:
            call.sampling.grammar.lark = lark

    def _render(self, call: ChatCall, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.render_chat(messages, call.tools, add_generation_prompt=add_generation_prompt,
                                              max_chars=self.model.max_prompt_chars, **call.template_kwargs)
        except RenderLimitExceeded as exc:
            raise self.model.limits.too_long("the prompt", exc.chars, "at least ") from None
        except (ChatTemplateError, TypeError, ValueError) as exc:
            raise BadRequest(f"the messages cannot be rendered with the model's chat template: {exc}",
                             "messages") from exc
        except RecursionError as exc:
            raise BadRequest("the messages or tools are nested too deeply", "messages") from exc

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        if len(prompt_ids) >= self.model.context_length:
            raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                             f"{self.model.context_length} tokens, leaving no room to generate",
                             "messages", "context_length_exceeded")

    async def chat(self, state: SessionState, call: ChatCall, prompt: Prompt, stream: bool = True
                   ) -> AsyncIterator[ChatDelta | ChatResult]:
        """Run a chat call whose prompt is ``prompt`` (from ``render``); without ``stream`` only the result comes
        (and text is decoded once, unless stop strings need it as it grows)."""
        started, t0 = time.time(), time.monotonic()
        has_history = any(m.get("role") == "assistant" for m in call.messages)
        build = await self.work.run(len(prompt.text), state.history.build, self.tokenizer, prompt.text, has_history)
        self.check_prompt(build.ids)
        self.metrics.count(TITO_COUNTERS[build.kind])
        if build.kind in (PARTIAL, FALLBACK):
            log.debug("session %s: TITO %s (reused %d ids of call %s)", state.session_id, build.kind, build.reused,
                      build.source)
        incremental = stream or bool(call.stop)
        # A client that waits for the whole answer (and no stop string to watch) needs no chunk in between.
        prompt_ids = ids_field(build.ids)
        actor_call = ActorCall(self.actors, RouteRequest(state.session_id, prompt_ids, call.sampling.max_tokens,
                                                         state.group_id),
                               call.sampling, whole=not incremental)
        assembler = TextAssembler(self.tokenizer, call.stop, incremental=incremental)
        out = Completion(t0)
        shown = ChatDelta()
        last: actor_pb2.GenerateChunk | None = None
        with self._running(state):
            async with contextlib.aclosing(actor_call.chunks()) as chunks:
                async for chunk in chunks:
                    out.add(chunk)
                    ids = list(chunk.token_ids)
                    assembler.feed(ids[:-1] if chunk.finish_reason == STOP and ids else ids)
                    if assembler.stop_hit is not None and not actor_call.aborted:
                        await actor_call.abort()
                    if chunk.finish_reason:
                        last = chunk
                        break
                    if not stream:
                        continue
                    visible = assembler.visible()
                    reasoning, content = self.parser.visible(prompt.answer_start + visible, call.parse_tools)
                    delta = ChatDelta(_grow(shown.text, visible, "text"), _grow(shown.reasoning, reasoning, "reasoning"),
                                      _grow(shown.content, content, "content"), ids, list(chunk.logprobs),
                                      list(chunk.weight_versions), list(chunk.top_logprobs))
                    shown = ChatDelta(visible, reasoning, content)
                    yield delta
            text_out = assembler.final()
            parsed = self.parser.parse(prompt.answer_start + text_out, call.parse_tools, call.tools)
            if not call.parallel_tool_calls:
                del parsed.tool_calls[1:]
            stopped = assembler.stop_hit is not None
            finish = STOP if stopped or last.finish_reason in (STOP, ABORT) else LENGTH
            ended = time.time()
            record = pool_pb2.CallRecord(
                session_id=state.session_id, index=-1, prompt_ids=prompt_ids, completion_ids=out.token_ids,
                logprobs=out.logprobs, weight_versions=out.versions, actor=out.actor or self._fallback_name(actor_call),
                timing=self._timing(last, ended - started, started, state), finish_reason=finish,
                sampling=call.sampling, created_at=ended, routed_experts=routing_of(last, len(build.ids), out),
                adapter=self.actors.adapter)
            index = await self._record(state, record)
            self.metrics.call_done(time.monotonic() - t0, out.ttft)
            yield ChatResult(
                text=_grow(shown.text, text_out, "text"),
                reasoning=_grow(shown.reasoning, parsed.reasoning or "", "reasoning"),
                content=_grow(shown.content, parsed.content, "content"), token_ids=list(last.token_ids),
                logprobs=list(last.logprobs), weight_versions=list(last.weight_versions),
                top_logprobs=list(last.top_logprobs), finish_reason=finish,
                stopped_by_string=stopped, stop_string=assembler.stop_hit, parsed=parsed, call_index=index,
                session_id=state.session_id,
                prompt_ids=build.ids, completion_ids=out.token_ids, all_logprobs=out.logprobs,
                all_top_logprobs=out.top_logprobs, all_weight_versions=out.versions, tito=build.kind)

    async def generate(self, state: SessionState, prompt_ids: Sequence[int], sampling: common_pb2.SamplingParams,
                       whole: bool = False) -> AsyncIterator[tuple[actor_pb2.GenerateChunk, int | None]]:
        """Token-level generation recorded as a call: the actor's chunks, the last one with the call's index;
        ``whole``: one chunk, the whole completion."""
        if not prompt_ids:
            raise BadRequest("prompt_ids is empty", "prompt_ids")
        self.check_prompt(prompt_ids)           # by its length, before the ids are scanned
        ids = np.asarray(prompt_ids, dtype=np.int64)
        bad = ids[(ids < 0) | (ids >= self.model.vocab_size)]
        if bad.size:
            raise BadRequest(f"prompt ids outside the vocabulary [0, {self.model.vocab_size}): {bad[:5].tolist()}",
                             "prompt_ids")
        # prompt_ids stays as given: a request's protobuf field goes into the actor's request and the pool's record at
        # C speed, where a list of it would cost a Python object an id.
        started, t0 = time.time(), time.monotonic()
        actor_call = ActorCall(self.actors, RouteRequest(state.session_id, prompt_ids, sampling.max_tokens,
                                                         state.group_id), sampling,
                               whole=whole)
        out = Completion(t0)
        with self._running(state):
            async with contextlib.aclosing(actor_call.chunks()) as chunks:
                async for chunk in chunks:
                    out.add(chunk)
                    if chunk.finish_reason:
                        ended = time.time()
                        record = pool_pb2.CallRecord(
                            session_id=state.session_id, index=-1, prompt_ids=prompt_ids, completion_ids=out.token_ids,
                            logprobs=out.logprobs, weight_versions=out.versions,
                            actor=out.actor or self._fallback_name(actor_call),
                            timing=self._timing(chunk, ended - started, started, state),
                            finish_reason=chunk.finish_reason, sampling=sampling, created_at=ended,
                            routed_experts=routing_of(chunk, len(prompt_ids), out), adapter=self.actors.adapter)
                        index = await self._record(state, record)
                        self.metrics.call_done(time.monotonic() - t0, out.ttft)
                        yield chunk, index
                        return
                    yield chunk, None

    @contextlib.contextmanager
    def _running(self, state: SessionState) -> Iterator[None]:
        """Count a call of ``state`` in flight while it runs, and its failure upstream (an actor or the record)."""
        state.in_flight += 1
        try:
            yield
        except UpstreamFailed as exc:
            state.failures.append(exc.message)
            self.metrics.count("call_failures")
            raise
        finally:
            state.in_flight -= 1
            state.touch()

    async def _record(self, state: SessionState, record: pool_pb2.CallRecord) -> int:
        try:
            check_call(record)          # before an implicit session is opened for it: a refusal leaves nothing
        except InvalidRequestError as exc:
            raise UpstreamFailed(f"the actor's completion cannot be recorded: {exc}") from exc
        await self.sessions.ensure_open(state)
        index = await self.sessions.pool.append_call(record)
        state.history.add(index, record.prompt_ids, record.completion_ids)
        state.last_end = record.created_at
        return index

    @staticmethod
    def _fallback_name(actor_call: ActorCall) -> str:
        return actor_call.actor.endpoint.address if actor_call.actor else ""

    @staticmethod
    def _timing(last: actor_pb2.GenerateChunk, total_s: float, started: float, state: SessionState
                ) -> common_pb2.Timing:
        tool_s = max(0.0, started - state.last_end) if state.last_end else 0.0
        t = last.timing
        return common_pb2.Timing(queue_s=t.queue_s, prefill_s=t.prefill_s, decode_s=t.decode_s, total_s=total_s,
                                 tool_s=tool_s)
