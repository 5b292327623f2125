"""The aiohttp application serving the Tinker API under ``/api/v1``: a key is required on every request but healthz
(``X-API-Key``, or ``Authorization: Bearer``; /metrics takes either too), bodies are bounded (413), and every error
answers JSON ``{"error", "category"}`` with a 4xx for the client's mistakes and a 500 for the server's, which the
SDK retries. Nothing a request does wrong stops the server."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from forge.learner.tinker import routes_rest, routes_sampling, routes_service, routes_training, routes_weights
from forge.learner.tinker.dispatch import OWNER, STATE
from forge.learner.tinker.errors import SERVER, USER, ApiError, as_api_error, unauthorized
from forge.learner.tinker.sessions import owner_of
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import UserError
from forge.prometheus import request_key, stats_registry
from forge.rpc.auth import matches_any

log = logging.getLogger(__name__)
OPEN_PATHS = ("/api/v1/healthz",)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)


def make_app(state: TinkerState, report: Callable | None = None) -> web.Application:
    keys = tuple(state.config.api_keys)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        state.counts["http_requests"] += 1
        try:
            if request.path not in OPEN_PATHS:
                key = request_key(request.headers.get("Authorization"), request.headers.get("X-API-Key"))
                if key is None or not matches_any(key, keys):
                    raise unauthorized()
                request[OWNER] = owner_of(key)
            return await handler(request)
        except ApiError as exc:
            return refused(exc)
        except UserError as exc:
            return refused(as_api_error(exc))
        except web.HTTPException as exc:            # aiohttp's own: no route, wrong method, body too large
            if exc.status < 400:
                raise
            return refused(ApiError(exc.status, exc.reason))
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            state.counts["errors"] += 1
            return error_response(ApiError(500, "the server failed; see its log", SERVER))

    def refused(error: ApiError) -> web.Response:
        state.counts["client_errors" if error.category == USER and error.status < 500 else "errors"] += 1
        return error_response(error)

    app = web.Application(middlewares=[guard], client_max_size=state.config.max_body_bytes)
    app[STATE] = state
    for routes in (routes_service, routes_training, routes_weights, routes_sampling, routes_rest):
        routes.add_routes(app)
    if report is not None:
        registry = stats_registry(report)

        async def metrics(request: web.Request) -> web.Response:
            encode, content_type = choose_encoder(request.headers.get("Accept", ""))
            return web.Response(body=encode(registry), headers={"Content-Type": content_type})

        app.router.add_get("/metrics", metrics)
    return app
