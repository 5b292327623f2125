"""The HTTP front end (aiohttp) for black-box agents, plus session endpoints for launchers.

Routes: ``GET /health``; ``GET /v1/models``, ``GET /v1/models/{model}``; the model calls of every wire format
(``forge.gateway.http.formats``: OpenAI's ``POST /v1/chat/completions`` and ``POST /v1/responses``, Anthropic's
``POST /v1/messages``) and Anthropic's ``POST /v1/messages/count_tokens``, all also under a session prefix
(``/s/{session_id}/v1/...``); vLLM's ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``;
``POST /v1/sessions``, ``GET /v1/sessions/{id}``, ``POST /v1/sessions/{id}/end``, ``POST /v1/sessions/{id}/rewards``;
``GET /v1/stats``; ``GET /metrics`` (Prometheus, from the same report as ``/v1/stats``). Every error is a 4xx (5xx
only when actors or the pool fail) in the shape of the path's format (OpenAI's by default)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from forge import __version__
from forge.gateway.auth import Operation
from forge.gateway.calls import ChatResult
from forge.gateway.errors import BadRequest, GatewayError, MethodNotAllowed, NotFound, TooLarge
from forge.gateway.http.body import read_body
from forge.gateway.http.conversations import Conversations
from forge.gateway.http.decode import check_model, decode_json, prepare_call, prepare_count
from forge.gateway.http.formats import WIRE_FORMATS, WIRE_PATHS
from forge.gateway.http.samples import all_results, indexed
from forge.gateway.http.sessions_json import (
    close_request,
    open_request,
    reward_request,
    session_json,
    session_with_calls_json,
)
from forge.gateway.http.tokenize import detokenize, tokenize
from forge.gateway.http.wire import Answering, Event, WireFormat
from forge.gateway.messages import INT32_MAX, ChatCall, check_text
from forge.gateway.service import Gateway
from forge.prometheus import stats_registry
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Forge-Session-Id"
HEADER_FIELDS = {"X-Forge-Task-Id": "task_id", "X-Forge-Domain": "domain", "X-Forge-Group-Id": "group_id"}
DISCONNECTED = (ConnectionError,)          # ConnectionResetError included: the client went away
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Connections the kernel holds for the loop to accept, and how many the loop accepts a turn (asyncio takes up to the
# backlog at once). aiohttp's 128 overflows when thousands of agents connect at once, and a connection left in the
# kernel's queue too long is reset under the client. The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096


def request_key(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("X-Api-Key") or None


def json_error(error: GatewayError, wire: WireFormat | None = None) -> web.Response:
    """An error answered in the shape of the format the path speaks (OpenAI's by default)."""
    return web.json_response(wire.error(error) if wire else error.to_json(), status=error.status)


def wire_of(path: str) -> WireFormat | None:
    """The format of the call at ``path`` (Anthropic's token count answers errors as Messages does)."""
    path = path.removesuffix("/count_tokens")
    return next((wire for suffix, wire in WIRE_PATHS.items() if path.endswith(suffix)), None)


class HttpFrontEnd:
    def __init__(self, gateway: Gateway, max_body_bytes: int, shutdown_grace_s: float = 30.0) -> None:
        self.gateway = gateway
        self.max_body_bytes = max_body_bytes
        self.shutdown_grace_s = shutdown_grace_s
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.registry = stats_registry(gateway.report)
        self.conversations = Conversations()
        self.answering = Answering(gateway.model, gateway.config.model_name)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._middleware])
        app.router.add_get("/health", self.health)
        for prefix in ("", "/s/{sid}"):
            app.router.add_get(prefix + "/v1/models", self._allowed(Operation.MODELS, self.models))
            app.router.add_get(prefix + "/v1/models/{model:.+}", self._allowed(Operation.MODELS, self.model_info))
            for path, wire in WIRE_PATHS.items():
                app.router.add_post(prefix + path, self._allowed(Operation.CHAT, self._model_call(wire)))
            app.router.add_post(prefix + "/v1/messages/count_tokens", self._allowed(Operation.CHAT, self.count_tokens))
        app.router.add_post("/v1/sessions", self._allowed(Operation.START_SESSION, self.start_session))
        app.router.add_get("/v1/sessions/{sid}", self._allowed(Operation.GET_SESSION, self.get_session))
        app.router.add_post("/v1/sessions/{sid}/end", self._allowed(Operation.END_SESSION, self.end_session))
        app.router.add_post("/v1/sessions/{sid}/rewards", self._allowed(Operation.ADD_REWARD, self.add_reward))
        app.router.add_get("/v1/stats", self._allowed(Operation.STATS, self.stats))
        app.router.add_get("/metrics", self._allowed(Operation.METRICS, self.prometheus_metrics))
        app.router.add_post("/tokenize", self._allowed(Operation.TOKENIZE, self.tokenize))
        app.router.add_post("/detokenize", self._allowed(Operation.TOKENIZE, self.detokenize))
        app.router.add_get("/version", self._allowed(Operation.MODELS, self.version))
        return app

    async def start(self, host: str, port: int) -> str:
        self.runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=self.shutdown_grace_s)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, shutdown_timeout=self.shutdown_grace_s, backlog=LISTEN_BACKLOG)
        await site.start()
        bound = self.runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}"
        return self.url

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded by the grace period), close."""
        if self.runner is not None:
            await self.runner.cleanup()

    # ------------------------------------------------------------------------------------ middleware

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        metrics = self.gateway.metrics
        metrics.count("http_requests")
        try:
            if request.path != "/health":
                request["caller"] = self.gateway.policy.authenticate(request_key(request))
            return await handler(request)
        except GatewayError as exc:
            metrics.count("client_errors" if exc.status < 500 else "errors")
            return json_error(exc, wire_of(request.path))
        except web.HTTPException as exc:
            metrics.count("client_errors" if exc.status < 500 else "errors")
            error: GatewayError
            if exc.status == 404:
                error = NotFound(f"no route {request.method} {request.path}")
            elif exc.status == 405:
                error = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
            elif exc.status == 413:
                error = TooLarge(f"the request body exceeds {self.max_body_bytes} bytes")
            else:
                error = BadRequest(exc.reason or "bad request")
                error.status = exc.status
            return json_error(error, wire_of(request.path))
        except Exception:
            metrics.count("errors")
            log.exception("%s %s failed", request.method, request.path)
            return json_error(GatewayError("internal error"), wire_of(request.path))

    def _allowed(self, operation: Operation, handler: Handler) -> Handler:
        """``handler`` once the key policy allows the caller ``operation`` on the session in the path; it finds the
        session the call acts on in ``request["session_id"]``."""

        async def allowed(request: web.Request) -> web.StreamResponse:
            sid = request.match_info.get("sid")
            request["session_id"] = self.gateway.policy.authorize(request["caller"], operation,
                                                                  sid and check_text(sid, "session_id"))
            return await handler(request)

        return allowed

    async def _raw(self, request: web.Request, required: bool = True) -> bytes | bytearray:
        """The body's bytes; empty (or only whitespace) is refused when ``required``, else read as no body."""
        raw = await read_body(request, self.max_body_bytes)
        if not raw or raw.isspace():
            if required:
                raise BadRequest("the request body is empty; send a JSON object")
            return b""
        return raw

    async def _json(self, request: web.Request, required: bool = True) -> Any:
        raw = await self._raw(request, required)
        return await self.gateway.work.run_isolated(len(raw), decode_json, raw) if raw else {}

    # -------------------------------------------------------------------------------------- routes

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _model_json(self, name: str | None = None) -> dict:
        return {"id": name or self.gateway.config.model_name, "object": "model", "created": int(self.gateway.started),
                "owned_by": "forge", "root": self.gateway.model.model_id,
                "max_model_len": self.gateway.model.context_length}

    @property
    def served(self) -> frozenset[str]:
        """The model names a request may give: the gateway's model name, its aliases and the model's id."""
        config = self.gateway.config
        return frozenset((config.model_name, *config.served_model_names, self.gateway.model.model_id))

    def served_at(self, request: web.Request) -> frozenset[str] | None:
        """The model names a request may give on its URL; None: any. A session's URL serves the session's model
        whatever name a program hard-codes (its author chose the name for another provider); the global URL
        answers 404 for a name it does not serve."""
        return None if "sid" in request.match_info else self.served

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_json()]})

    async def model_info(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        check_model({"model": name}, self.served_at(request))
        return web.json_response(self._model_json(name if name not in self.served else None))

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": __version__})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        check_model(body, self.served)
        return web.json_response(tokenize(self.gateway.model, body))

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        check_model(body, self.served)
        return web.json_response(detokenize(self.gateway.model, body))

    async def stats(self, request: web.Request) -> web.Response:
        report = self.gateway.report()
        return web.json_response({"service": report.service, "uptime_s": report.uptime_s,
                                  "gauges": dict(report.gauges), "labels": dict(report.labels)})

    async def prometheus_metrics(self, request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})

    async def start_session(self, request: web.Request) -> web.Response:
        opening, issue_key = open_request(await self._json(request, required=False))
        record, key, url = await self.gateway.start_session(opening, issue_key)
        return web.json_response({"session": session_json(record), "api_key": key, "base_url": url})

    async def get_session(self, request: web.Request) -> web.Response:
        session_id = request["session_id"]
        stored = await self.gateway.get_session(session_id)
        include_ids = request.query.get("include_ids", "").lower() in ("1", "true", "yes")
        return web.json_response(session_with_calls_json(stored, include_ids))

    async def end_session(self, request: web.Request) -> web.Response:
        session_id = request["session_id"]
        record = await self.gateway.end_session(close_request(session_id, await self._json(request, False)))
        return web.json_response({"session": session_json(record)})

    async def add_reward(self, request: web.Request) -> web.Response:
        session_id = request["session_id"]
        index, reward = reward_request(await self._json(request))
        await self.gateway.add_reward(session_id, index, reward)
        return web.json_response({"session_id": session_id, "call_index": index, "reward": reward})

    @staticmethod
    def _open_as(request: web.Request) -> pool_pb2.OpenSessionRequest | None:
        """The fields of the session a call may open if it is unknown (X-Forge-* headers); None when a per-session
        key confines the call and the path names no session: the key's session must exist."""
        if "sid" not in request.match_info and not request["caller"].privileged:
            return None
        opening = pool_pb2.OpenSessionRequest(**{name: check_text(request.headers[h], h)
                                                 for h, name in HEADER_FIELDS.items() if h in request.headers})
        size = request.headers.get("X-Forge-Group-Size", "")
        if size:
            if not (size.isascii() and size.isdigit() and int(size) <= INT32_MAX):
                raise BadRequest(f"X-Forge-Group-Size must be an integer in [0, {INT32_MAX}]", "X-Forge-Group-Size")
            opening.group_size = int(size)
        return opening

    async def count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's token count of a Messages request: its prompt's tokens as the call would run."""
        raw = await self._raw(request)
        model, size = self.gateway.model, len(raw)
        call = await self.gateway.work.run_isolated(size, prepare_count, raw, self.served_at(request),
                                                    model.vocab_size, model.limits)
        call, _session = WIRE_FORMATS["messages"].complete(call, None, self.conversations, None)
        return web.json_response({"input_tokens": await self.gateway.prompt_tokens(call, size)})

    def _model_call(self, wire: WireFormat) -> Handler:
        """The handler of a model call in ``wire``'s format."""

        async def model_call(request: web.Request) -> web.StreamResponse:
            raw = await self._raw(request)
            model, size = self.gateway.model, len(raw)
            call, options = await self.gateway.work.run_isolated(size, prepare_call, raw, self.served_at(request),
                                                                 model.vocab_size, model.limits, wire.name)
            session_id = request["session_id"] or request.headers.get(SESSION_HEADER)
            if session_id:
                check_text(session_id, SESSION_HEADER)
            call, session_id = wire.complete(call, options, self.conversations, session_id)
            stream = wire.streams(options)
            calls = await self.gateway.chat_samples(call, wire.samples(options), session_id, self._open_as(request),
                                                    stream=stream, size=size)
            headers = {SESSION_HEADER: calls[0].session_id}
            if stream:
                return await self._stream(request, wire, (call, options), [c.events for c in calls], headers)
            results = await all_results([c.events for c in calls])
            try:
                for result in results:
                    wire.remember(call, options, result, self.conversations)
                headers["X-Forge-Call-Index"] = str(results[0].call_index)
                return web.json_response(wire.answer_samples(results, self.answering, options), headers=headers)
            except Exception as exc:
                self._unanswered(results, exc)
                raise

        return model_call

    def _unanswered(self, results: list[ChatResult], error: BaseException) -> None:
        """Recorded calls whose answer could not be sent: their session is marked as having a failed call (closed as
        failed, as after an actor's failure mid-call), so the pool never holds a call its agent did not get."""
        for result in results:
            self.gateway.call_unanswered(result.session_id, f"the answer to call {result.call_index} could not be "
                                                            f"sent: {type(error).__name__}")

    async def _stream(self, request: web.Request, wire: WireFormat, asked: tuple[ChatCall, Any],
                      streams: list[Any], headers: dict) -> web.StreamResponse:
        call, options = asked
        writers = wire.sample_writers(self.answering, options, len(streams))
        results: list[Any] = [None] * len(streams)
        begun: set[int] = set()
        response: web.StreamResponse | None = None

        async def send(sent: list[Event]) -> None:
            for event in sent:
                await response.write(event.encode())

        started = time.monotonic()
        try:
            async with contextlib.aclosing(indexed(streams)) as events:
                async for index, event in events:
                    if response is None:
                        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                                               "Cache-Control": "no-cache"})
                        await response.prepare(request)
                    if index not in begun:
                        begun.add(index)
                        await send(writers[index].first())
                    if isinstance(event, ChatResult):
                        results[index] = event
                        wire.remember(call, options, event, self.conversations)
                        await send(writers[index].final(event))
                    else:
                        await send(writers[index].deltas(event))
            await send(wire.closing(writers, results, options))
        except GatewayError as exc:
            if response is None:
                raise
            self.gateway.metrics.count("errors" if exc.status >= 500 else "client_errors")
            log.warning("streamed call of session %s failed after %.2f s: %s", headers[SESSION_HEADER],
                        time.monotonic() - started, exc.message)
            with contextlib.suppress(*DISCONNECTED):
                await send(writers[0].failed(exc))
            return response
        except DISCONNECTED:
            self.gateway.metrics.count("client_disconnects")
            log.debug("client of session %s went away mid-stream", headers[SESSION_HEADER])
            return response
        except Exception as exc:
            if response is None:
                raise
            self.gateway.metrics.count("errors")
            log.exception("streamed call of session %s failed after its first byte", headers[SESSION_HEADER])
            self._unanswered([r for r in results if r is not None], exc)
            with contextlib.suppress(*DISCONNECTED):
                await send(writers[0].failed(GatewayError("internal error")))
            return response
        with contextlib.suppress(*DISCONNECTED):
            await response.write_eof()
        return response
