"""The dash's aiohttp application: the page and its assets (shipped in ``static/``), and the JSON endpoints it polls.

| route | answers |
| --- | --- |
| ``GET /`` | the page |
| ``GET /api/run`` | the run directory, its pools and summary |
| ``GET /api/curves`` | the learner's metrics, one point per step |
| ``GET /api/health`` | the services' Stats, as ``forge top --json`` |
| ``GET /api/sessions?pool=&page=&page_size=&domain=&status=&min_reward=&max_reward=&min_version=&max_version=`` | a page of sessions |
| ``GET /api/sessions/{id}?pool=`` | a session's transcript, tokens and advantages |
| ``GET /api/sessions/{id}/tree?pool=`` | its group's prefix tree |
| ``GET /api/checkpoints?pool=`` | the steps of the learner checkpoints beside the pool, and the latest |
| ``GET /api/sessions/{id}/ratios?pool=&step=`` | per completion token, checkpoint ``step``'s (default: the latest) importance ratio and log-prob |

Pool reads and tokenizing run in worker threads, never on the event loop; loading a checkpoint and recomputing
log-probs in the ratios' own (``ratios.Ratios``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from forge.app.dash import query, ratios, security
from forge.app.dash.data import Curves, Pools, metrics_file, summary
from forge.app.dash.health import Health
from forge.app.dash.ratios import Ratios
from forge.pool import NotFoundError, PoolReader
from forge.pool.browse import group_sessions, list_sessions, read_session, transcript
from forge.tokenizer import Tokenizer

STATIC = Path(__file__).parent / "static"


@dataclass
class Dash:
    """What the handlers read: the run, its pools and curves, the health poller and the tokenizer."""

    run_dir: Path | None
    pools: Pools
    curves: Curves | None
    health: Health | None
    tokenizer: Tokenizer | None
    ratios: Ratios

    def pool_name(self, request: web.Request) -> str:
        name = query.text(request.query, "pool") or "pool"
        if name not in self.pools.names():
            raise NotFoundError(f"no pool {name!r} in this run")
        return name

    def reader(self, request: web.Request) -> PoolReader:
        return self.pools.reader(self.pool_name(request))

    def checkpoints(self, request: web.Request) -> Path:
        return ratios.checkpoints_dir(self.pools.names()[self.pool_name(request)])

    def decode(self, ids: Any) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.decode(list(ids))

    def piece(self, token: int) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.decode([token])


async def _in_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, work)


def _page(name: str) -> Callable[[web.Request], Any]:
    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / name, headers={"Cache-Control": "no-store"})

    return serve


async def run_info(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    query.check_known(request.query, frozenset())
    return web.json_response({
        "run_dir": str(dash.run_dir) if dash.run_dir else None, "pools": sorted(dash.pools.names()),
        "summary": await _in_thread(lambda: summary(dash.run_dir)) if dash.run_dir else None,
        "tokenizer": dash.tokenizer is not None, "health": dash.health is not None})


async def curves(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    query.check_known(request.query, frozenset())
    if dash.curves is None:
        return web.json_response({"steps": [], "curves": {}})
    return web.json_response(await _in_thread(dash.curves.series))


async def health(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    query.check_known(request.query, frozenset())
    if dash.health is None:
        return web.json_response({"time": None, "up": 0, "down": 0, "services": []})
    return web.json_response(dash.health.latest())


async def sessions(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    query.check_known(request.query, query.LIST_PARAMS)
    where = query.session_filter(request.query)
    number, size = query.page(request.query)
    reader = dash.reader(request)
    found = await _in_thread(lambda: list_sessions(reader, where, number, size))
    if number > 1 and not found.sessions:
        raise NotFoundError(f"no page {number}: {found.total} sessions match, {size} a page")
    return web.json_response({"page": found.page, "page_size": found.page_size, "has_more": found.has_more,
                              "total": found.total, "sessions": found.sessions})


def _session_view(dash: Dash, reader: PoolReader, session_id: str) -> dict[str, Any]:
    from forge.app.dash.views import advantages

    decode, piece = (dash.decode, dash.piece) if dash.tokenizer is not None else (None, None)
    out = transcript(reader, session_id, decode, piece)
    group = group_sessions(reader, session_id)
    by_session = advantages(group)
    mine = by_session.get(session_id, [])
    for call in out["calls"]:
        call["advantage"] = mine[call["index"]] if call["index"] < len(mine) else None
    out["group"] = [{"session_id": g.session.session_id, "advantage": (by_session.get(g.session.session_id) or
                                                                       [None])[0]} for g in group]
    return out


async def session(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    query.check_known(request.query, query.SESSION_PARAMS)
    reader = dash.reader(request)
    session_id = request.match_info["session_id"]
    return web.json_response(await _in_thread(functools.partial(_session_view, dash, reader, session_id)))


async def tree(request: web.Request) -> web.Response:
    from forge.app.dash.views import prefix_tree

    dash: Dash = request.app["dash"]
    query.check_known(request.query, query.SESSION_PARAMS)
    reader = dash.reader(request)
    session_id = request.match_info["session_id"]
    decode = dash.decode if dash.tokenizer is not None else None
    return web.json_response(await _in_thread(lambda: prefix_tree(group_sessions(reader, session_id), decode)))


async def checkpoints(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    query.check_known(request.query, query.SESSION_PARAMS)
    directory = dash.checkpoints(request)
    return web.json_response(await _in_thread(lambda: ratios.listing(directory)))


def _ratio_work(dash: Dash, request: web.Request) -> tuple[Path, list[Any]]:
    """The checkpoint asked for and the session's calls (within the dash's bound), or the 4xx why not."""
    query.check_known(request.query, query.RATIO_PARAMS)
    step = query.integer(request.query, "step", 0, query.MAX_STEP)
    directory = dash.checkpoints(request)
    reader = dash.reader(request)
    model_dir = ratios.pick(directory, step)
    return model_dir, ratios.session_calls(read_session(reader, request.match_info["session_id"]))


async def session_ratios(request: web.Request) -> web.Response:
    dash: Dash = request.app["dash"]
    model_dir, calls = await _in_thread(lambda: _ratio_work(dash, request))
    work = functools.partial(dash.ratios.compute, model_dir, calls)
    computed = await asyncio.get_running_loop().run_in_executor(dash.ratios.executor, work)
    return web.json_response({"step": ratios.step_of(model_dir), "calls": computed})


async def not_found(request: web.Request) -> web.Response:
    return security.error(404, f"no such page: {request.path[:200]}")


def make_app(dash: Dash, host: str, keys: tuple[str, ...]) -> web.Application:
    app = web.Application(middlewares=[security.headers, security.host_guard(host), security.key_guard(keys)],
                          client_max_size=64 * 1024)
    app["dash"] = dash
    login = security.login_handler(keys, lambda: web.FileResponse(STATIC / "login.html"))
    app.router.add_get("/", _page("index.html"))
    app.router.add_route("GET", "/login", login)
    app.router.add_route("POST", "/login", login)
    app.router.add_get("/api/run", run_info)
    app.router.add_get("/api/curves", curves)
    app.router.add_get("/api/health", health)
    app.router.add_get("/api/sessions", sessions)
    app.router.add_get("/api/sessions/{session_id}", session)
    app.router.add_get("/api/sessions/{session_id}/tree", tree)
    app.router.add_get("/api/sessions/{session_id}/ratios", session_ratios)
    app.router.add_get("/api/checkpoints", checkpoints)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    app.router.add_route("*", "/{tail:.*}", not_found)

    async def closing(_app: web.Application) -> None:
        if dash.health is not None:
            dash.health.stop()
        dash.pools.close()
        dash.ratios.close()

    app.on_cleanup.append(closing)
    return app


def build(run_dir: Path | None, pool: Path | None, health: Health | None, tokenizer: Tokenizer | None) -> Dash:
    curves_ = Curves(metrics_file(run_dir)) if run_dir is not None else None
    return Dash(run_dir=run_dir, pools=Pools(run_dir, pool), curves=curves_, health=health, tokenizer=tokenizer,
                ratios=Ratios())
