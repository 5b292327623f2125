"""Hostile structured-output schemas and deeply nested values against one real gateway (with a real actor and pool)
on loopback, through its three model-call APIs: OpenAI's chat completions, OpenAI's Responses and Anthropic's
Messages.

A schema that cannot run (an array of at least a billion items, a ``$ref`` cycle, a ``$ref`` to the root, a
required recursion, a pattern repeated a billion times, an array of up to a million items, an unknown type, a pattern
that does not parse), sent as the response format or as a forced strict tool's parameters, in a small body or in one
padded past the size the gateway decodes in a separate process, streamed or not, is refused with a 400 in that API's
own error shape and leaves the pool as it was; a bounded schema in the same places is answered. A value nested
hundreds of levels deep in tool parameters, ``chat_template_kwargs``, Responses ``metadata`` or a Messages
``tool_use`` input is refused the same way; ten levels deep, it is answered. Whatever the request, the gateway and
the actor are still running after it, ``GET /health`` answers 200, and a stream that began ends without an error in
it.

A property test generates JSON schemas (types, enums, properties and required, items, bounds from 0 to 10**10,
patterns of small pieces with huge ``{n}`` / ``{n,m}`` repeats, ``$ref`` to the root and to ``$defs``, anyOf /
oneOf / allOf), values nested up to 1000 levels deep and whole request bodies of the three APIs carrying them in
those places: never a 5xx, never a dead process, never an error inside a stream, and a refusal never changes the
pool.

A request that kills or wedges the actor or the gateway fails its test; the next test meets a new actor and gateway
(on the same pool), so that each test reports its own outcome."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from forge.gateway.off_loop import PROCESS_SIZE
from integration.gateway.test_gateway_properties import pool_snapshot, settle_one_call_session

from helpers.gateway_procs import Proc, Stack, start_actor, start_gateway
from helpers.waiting import WAIT_S

GATEWAY_ARGS = ("--max-body-bytes", str(4 << 20))        # for the stack fixture (conftest.py): padded bodies fit
PADDING = "x" * PROCESS_SIZE          # a body carrying it is decoded in the gateway's separate decoding process
# The examples of the property test: bounded, reproducible, and not shrunk (a failing example may have killed a
# process, and each step of shrinking would wait for a new one to start: the drawn example is reported as it is).
HOSTILE = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                   phases=(Phase.explicit, Phase.generate),
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large])

Api = Literal["chat", "responses", "messages"]
# What a case expects: answered (2xx), refused (400), either of the two, or (the property test) any status below 500.
Expect = Literal["answer", "refuse", "either", "any"]
APIS: tuple[Api, ...] = ("chat", "responses", "messages")
PATHS: dict[Api, str] = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
HI = [{"role": "user", "content": "hi"}]
BASE: dict[Api, dict] = {"chat": {"messages": HI, "max_tokens": 2}, "responses": {"input": "hi", "max_output_tokens": 2},
                         "messages": {"messages": HI, "max_tokens": 2}}


# ------------------------------------------------------------------------------------------------ request bodies


def response_format(api: Api, schema: dict) -> dict:
    """The fields of a body of ``api`` asking for output that matches ``schema``."""
    return {"chat": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
            "responses": {"text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}},
            "messages": {"output_config": {"format": {"type": "json_schema", "schema": schema}}}}[api]


def strict_tool(api: Api, schema: dict) -> dict:
    """The fields of a body of ``api`` forcing a call of a strict tool whose parameters are ``schema``."""
    return {"chat": {"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": schema}}],
                     "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "responses": {"tools": [{"type": "function", "name": "f", "strict": True, "parameters": schema}],
                          "tool_choice": {"type": "function", "name": "f"}},
            "messages": {"tools": [{"name": "f", "strict": True, "input_schema": schema}],
                         "tool_choice": {"type": "tool", "name": "f"}}}[api]


SCHEMA_PLACES: dict[str, Callable[[Api, dict], dict]] = {"format": response_format, "tool": strict_tool}


def padded(api: Api) -> dict:
    """A field each API accepts and ignores, holding ``PADDING``: the body passes the separate decoding size."""
    return {"chat": {"user": PADDING}, "responses": {"user": PADDING},
            "messages": {"metadata": {"user_id": PADDING}}}[api]


def tool_parameters(api: Api, value: Any) -> dict:
    """A (not strict) tool whose parameters' schema holds ``value`` as a default."""
    schema = {"type": "object", "properties": {"x": {"default": value}}}
    return {"chat": {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]},
            "responses": {"tools": [{"type": "function", "name": "f", "parameters": schema}]},
            "messages": {"tools": [{"name": "f", "input_schema": schema}]}}[api]


def tool_use_input(value: Any) -> dict:
    """A Messages history whose assistant turn called a tool with ``value`` in its input, and its result."""
    return {"messages": [*HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                                                  "input": {"x": value}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}


DEEP_PLACES: dict[tuple[Api, str], Callable[[Any], dict]] = {
    ("chat", "tool-parameters"): lambda value: tool_parameters("chat", value),
    ("chat", "chat_template_kwargs"): lambda value: {"chat_template_kwargs": {"x": value}},
    ("responses", "tool-parameters"): lambda value: tool_parameters("responses", value),
    ("responses", "chat_template_kwargs"): lambda value: {"chat_template_kwargs": {"x": value}},
    ("responses", "metadata"): lambda value: {"metadata": {"x": value}},
    ("messages", "tool-input_schema"): lambda value: tool_parameters("messages", value),
    ("messages", "tool_use-input"): tool_use_input,
}
Shape = Literal["object", "array"]
MARKER = re.compile(r'"\\u0000deep:(object|array):(\d+)"')


def deep(depth: int, shape: Shape = "object") -> str:
    """A placeholder for a value nested ``depth`` levels deep (``{"a": {"a": ... 1}}`` or ``[[... 1]]``), written
    into the sent text by ``encode`` (the client's own encoder could not nest that deep)."""
    return f"\x00deep:{shape}:{depth}"


def nested(shape: str, depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth if shape == "object" else "[" * depth + "1" + "]" * depth


def encode(body: dict) -> bytes:
    return MARKER.sub(lambda match: nested(match[1], int(match[2])), json.dumps(body)).encode()


# ------------------------------------------------------------------------------------------------ the stack


@dataclass
class Outcome:
    """What a request got: the response (None: no answer at all), its body, and why reading it failed, if it did."""

    response: httpx.Response | None
    body: bytes = b""
    broken: str = ""

    @property
    def status(self) -> int | None:
        return None if self.response is None else self.response.status_code

    def __str__(self) -> str:
        if self.response is None:
            return f"no answer ({self.broken})"
        text = f"HTTP {self.status} {self.body[:600].decode(errors='replace')!r}"
        return text + (f" and then the stream broke ({self.broken})" if self.broken else "")


HEALTHY = {"gateway running": True, "actor running": True, "gateway /health": 200, "actor health": "SERVING"}


class Target:
    """The stack's gateway and actor, replaced by new ones (on the same pool) once a request has killed one or left
    one unable to answer: that request's test has failed, and the next test meets a live pair."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = httpx.Client(timeout=WAIT_S)
        self.started: list[Proc] = []
        self.harmed = False

    @property
    def procs(self) -> tuple[Proc, Proc]:
        return self.stack.gateway, self.stack.actor

    def state(self) -> dict[str, object]:
        """Whether each process runs, what the gateway's ``/health`` answers and what the actor's gRPC health check
        answers (an actor whose engine process died stops serving, and exits a little later); ``HEALTHY`` when
        all is well."""
        state = {"gateway running": self.stack.gateway.alive(), "actor running": self.stack.actor.alive(),
                 "gateway /health": self._gateway_health(), "actor health": self._actor_health()}
        if state != HEALTHY:
            self.harmed = True
        return state

    def _gateway_health(self) -> int | str:
        try:
            return self.http.get(f"{self.stack.gateway.http}/health").status_code
        except httpx.HTTPError as exc:
            return f"no answer ({exc!r})"

    def _actor_health(self) -> str:
        with grpc.insecure_channel(self.stack.actor.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="forge.v1.Actor"), timeout=WAIT_S)
            except grpc.RpcError as exc:
                return exc.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def ensure_live(self) -> None:
        if not self.harmed and self.state() == HEALTHY:
            return
        for proc in self.procs:
            proc.kill()
        directory = self.stack.directory
        actor = start_actor(directory, "actor", "--model", str(directory / "random-tiny"))
        self.started.append(actor)
        self.stack.actor = actor
        self.stack.gateway = start_gateway(directory, [actor.address], self.stack.pool, *GATEWAY_ARGS)
        self.started.append(self.stack.gateway)
        self.harmed = False

    def send(self, path: str, raw: bytes) -> Outcome:
        url = f"{self.stack.gateway.http}{path}"
        try:
            with self.http.stream("POST", url, content=raw, headers={"Content-Type": "application/json"}) as response:
                try:
                    return Outcome(response, response.read())
                except httpx.HTTPError as exc:
                    return Outcome(response, b"", repr(exc))
        except httpx.HTTPError as exc:
            self.harmed = True
            return Outcome(None, b"", repr(exc))

    def close(self) -> None:
        self.http.close()
        for proc in reversed(self.started):
            proc.stop()


@pytest.fixture(scope="module")
def target(stack: Stack) -> Iterator[Target]:
    started = Target(stack)
    yield started
    started.close()


# ------------------------------------------------------------------------------------------------ the invariants


def stream_events(raw: bytes) -> list[tuple[str | None, Any]]:
    """The (name, data) of each server-sent event; data None for ``[DONE]``, the text where it is not JSON."""
    events: list[tuple[str | None, Any]] = []
    for block in raw.decode(errors="replace").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, ""
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        try:
            events.append((name, None if data == "[DONE]" else json.loads(data)))
        except (ValueError, RecursionError):
            events.append((name, data))
    return events


def check_answer(api: Api, streamed: bool, outcome: Outcome, summary: str) -> None:
    """A 2xx is the API's answer: its whole object, or a stream with no error in it that ends as the API ends one."""
    assert not outcome.broken, summary
    if not streamed:
        answer = json.loads(outcome.body)
        kind = {"chat": ("object", "chat.completion"), "responses": ("object", "response"),
                "messages": ("type", "message")}[api]
        assert answer.get(kind[0]) == kind[1], summary
        return
    events = stream_events(outcome.body)
    errors = [e for e in events if e[0] in ("error", "response.failed") or (isinstance(e[1], dict) and "error" in e[1])]
    assert events and not errors, summary
    last = events[-1]
    if api == "chat":
        assert last[1] is None, f"the stream did not end with [DONE]: {summary}"
    else:
        ends = ("response.completed", "response.incomplete") if api == "responses" else ("message_stop",)
        assert last[0] in ends, f"the stream ended with {last[0]!r}: {summary}"


def check_refusal(api: Api, outcome: Outcome, summary: str) -> None:
    """A 4xx is an error in the API's own shape, with a message."""
    error = json.loads(outcome.body)
    if api == "messages":
        assert error.get("type") == "error" and isinstance(error.get("error"), dict), summary
    else:
        assert set(error) == {"error"} and isinstance(error["error"], dict), summary
        assert set(error["error"]) == {"message", "type", "param", "code"}, summary
    details = error["error"]
    if outcome.status == 400:
        assert details.get("type") == "invalid_request_error", summary
    assert isinstance(details.get("message"), str) and details["message"].strip(), summary


def check(target: Target, api: Api, body: dict, expect: Expect) -> int | None:
    """Send ``body`` to ``api`` and check it got what ``expect`` says, with every process still running, /health
    answering, and the pool unchanged by a refusal; the status."""
    target.ensure_live()
    reader = target.stack.reader
    before = pool_snapshot(reader)
    raw = encode(body)
    outcome = target.send(PATHS[api], raw)
    state = target.state()
    summary = f"POST {PATHS[api]} ({len(raw)} bytes): {outcome}; {state}"
    if outcome.status is None or outcome.status >= 300:
        summary += f"; the pool changed: {pool_snapshot(reader) != before}"
    assert state == HEALTHY, summary
    status = outcome.status
    assert status is not None and status < 500, summary
    if expect == "refuse":
        assert status == 400, summary
    elif expect == "answer":
        assert 200 <= status < 300, summary
    elif expect == "either":
        assert status == 400 or 200 <= status < 300, summary
    assert 200 <= status < 300 or 400 <= status < 500, summary
    if status >= 400:
        check_refusal(api, outcome, summary)
        assert pool_snapshot(reader) == before, f"a refusal changed the pool: {summary}"
    else:
        check_answer(api, bool(body.get("stream")), outcome, summary)
        assert outcome.response is not None
        settle_one_call_session(reader, outcome.response)
    return status


# ------------------------------------------------------------------------------------------------ schemas

UNRUNNABLE = {
    "billion-items": {"type": "array", "minItems": 1000000000},
    "ref-cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "ref-to-root": {"$ref": "#"},
    "required-recursion": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    "billion-repeats": {"type": "string", "pattern": "^a{1000000000}$"},
    "million-items-at-most": {"type": "array", "maxItems": 1000000},
    "unknown-type": {"type": "foo"},
    "broken-pattern": {"type": "string", "pattern": "(("},
}
BOUNDED = {
    "any-object": {"type": "object"},
    "record": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer"}},
               "required": ["name"]},
    "few-items": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"},
                                                          "maxItems": 3}}},
    "optional-recursion": {"type": "object", "properties": {"next": {"$ref": "#"}}},
    "defs-and-repeat": {"$defs": {"code": {"type": "string", "pattern": "^a{3}$"}}, "type": "object",
                        "properties": {"code": {"$ref": "#/$defs/code"}, "kind": {"enum": ["x", "y"]}},
                        "required": ["kind"]},
}
STREAMED = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@STREAMED
@pytest.mark.parametrize("schema", sorted(UNRUNNABLE))
@pytest.mark.parametrize("place", sorted(SCHEMA_PLACES))
@pytest.mark.parametrize("api", APIS)
def test_a_schema_that_cannot_run_is_refused_in_the_apis_shape(target, api, place, schema, stream):
    body = {**BASE[api], **SCHEMA_PLACES[place](api, UNRUNNABLE[schema]), "stream": stream}
    check(target, api, body, "refuse")


@pytest.mark.parametrize("place", sorted(SCHEMA_PLACES))
@pytest.mark.parametrize("api", APIS)
def test_a_billion_items_in_a_body_decoded_apart_are_refused(target, api, place):
    body = {**BASE[api], **padded(api), **SCHEMA_PLACES[place](api, UNRUNNABLE["billion-items"])}
    assert len(encode(body)) > PROCESS_SIZE
    check(target, api, body, "refuse")


@STREAMED
@pytest.mark.parametrize("schema", sorted(BOUNDED))
@pytest.mark.parametrize("place", sorted(SCHEMA_PLACES))
@pytest.mark.parametrize("api", APIS)
def test_a_bounded_schema_is_answered(target, api, place, schema, stream):
    body = {**BASE[api], **SCHEMA_PLACES[place](api, BOUNDED[schema]), "stream": stream}
    check(target, api, body, "answer")


# ------------------------------------------------------------------------------------------------ nesting


def depth_expectation(place: str, depth: int) -> Expect:
    """Hundreds of levels are refused; ten are answered, except that Responses ``metadata`` (strings, in OpenAI's
    API) may be refused whatever it holds."""
    if depth > 10:
        return "refuse"
    return "either" if place == "metadata" else "answer"


@STREAMED
@pytest.mark.parametrize("shape", ["object", "array"])
@pytest.mark.parametrize("depth", [10, 600, 980])
@pytest.mark.parametrize(("api", "place"), sorted(DEEP_PLACES), ids=[f"{a}-{p}" for a, p in sorted(DEEP_PLACES)])
def test_a_deeply_nested_value_is_refused_in_the_apis_shape(target, api, place, depth, shape, stream):
    body = {**BASE[api], **DEEP_PLACES[api, place](deep(depth, shape)), "stream": stream}
    check(target, api, body, depth_expectation(place, depth))


# ------------------------------------------------------------------------------------------------ properties

BOUND = st.one_of(st.integers(0, 5), st.sampled_from([64, 1000, 10**5, 10**6, 10**9, 10**10]), st.integers(0, 10**10))
REPEAT = st.one_of(st.sampled_from(["", "*", "+", "?"]), BOUND.map(lambda n: f"{{{n}}}"),
                   st.tuples(BOUND, BOUND).map(lambda pair: f"{{{min(pair)},{max(pair)}}}"))
ATOM = st.sampled_from(["a", "b", ".", "[a-z]", "[0-9]", "\\d", "(a|b)", "(ab)", "\\."])
PATTERN = st.one_of(
    st.tuples(st.booleans(), st.lists(st.tuples(ATOM, REPEAT).map("".join), min_size=1, max_size=3).map("".join))
    .map(lambda t: f"^{t[1]}$" if t[0] else t[1]),
    st.sampled_from(["((", "[", "a{2,1}", "*", "(?<=a)b", "\\"]))
NAME = st.sampled_from(["a", "b", "name", "x"])
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4))
LEAF = st.one_of(
    st.sampled_from([{}, {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
                     {"type": "null"}, {"$ref": "#"}, {"$ref": "#/$defs/a"}, {"$ref": "#/$defs/missing"},
                     {"type": "foo"}]),
    st.lists(SCALAR, min_size=1, max_size=3).map(lambda values: {"enum": values}),
    st.fixed_dictionaries({"type": st.just("string")}, optional={"minLength": BOUND, "maxLength": BOUND,
                                                                  "pattern": PATTERN}),
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])},
                          optional={"minimum": st.integers(-(10**10), 10**10),
                                    "maximum": st.integers(-(10**10), 10**10)}))


def compound(inner: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(NAME, inner, max_size=3)},
                              optional={"required": st.lists(NAME, max_size=3, unique=True),
                                        "additionalProperties": st.booleans()}),
        st.fixed_dictionaries({"type": st.just("array")}, optional={"items": inner, "minItems": BOUND,
                                                                     "maxItems": BOUND}),
        st.tuples(st.sampled_from(["anyOf", "oneOf", "allOf"]), st.lists(inner, min_size=1, max_size=3))
        .map(lambda t: {t[0]: t[1]}))


NODE = st.recursive(LEAF, compound, max_leaves=6)
SCHEMA = st.tuples(NODE, st.dictionaries(st.sampled_from(["a", "b"]), NODE, max_size=2)).map(
    lambda t: {**t[0], "$defs": t[1]} if t[1] else t[0])
DEEP_VALUE = st.builds(deep, st.one_of(st.integers(0, 1000), st.sampled_from([0, 10, 600, 980, 1000])),
                       st.sampled_from(["object", "array"]))


def bodies(api: Api) -> st.SearchStrategy[dict]:
    """Bodies of ``api``: a schema in one of its places or none, a deep value in one of its places or none, streamed
    or not."""
    places = sorted(place for a, place in DEEP_PLACES if a == api)
    schema = st.one_of(st.just({}), st.builds(lambda place, s: SCHEMA_PLACES[place](api, s),
                                              st.sampled_from(sorted(SCHEMA_PLACES)), SCHEMA))
    value = st.one_of(st.just({}), st.builds(lambda place, v: DEEP_PLACES[api, place](v), st.sampled_from(places),
                                             DEEP_VALUE))
    return st.tuples(schema, value, st.booleans()).map(
        lambda t: {**BASE[api], **t[0], **t[1], "stream": t[2]})


@pytest.mark.timeout(900)
@pytest.mark.parametrize("api", APIS)
@HOSTILE
@given(data=st.data())
def test_generated_schemas_and_nesting_never_fail_the_gateway_and_refusals_leave_the_pool_unchanged(
        target, api, data):
    body = data.draw(bodies(api), "body")
    status = check(target, api, body, "any")
    event(f"HTTP {status}")


def test_the_bodies_carry_deep_values_as_meant():
    assert encode({"v": deep(2)}) == b'{"v": {"a": {"a": 1}}}'
    assert encode({"v": [deep(3, "array"), deep(0)]}) == b'{"v": [[[[1]]], 1]}'


def test_the_gateway_logged_no_traceback(target):
    gateway = target.stack.gateway
    assert gateway.alive() and "Traceback" not in gateway.log()
