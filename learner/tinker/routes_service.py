"""The service endpoints: client/config (the SDK's feature flags: API keys, not JWTs; plain httpx; batches split
below the body limit), client/dynamic_config, healthz, get_server_capabilities, create_session, session_heartbeat,
sessions/{id}/finish (the session's models are unloaded; their checkpoints stay), telemetry (accepted and dropped)
and cancel_future (nothing to cancel early: the result is dropped when it expires)."""

from __future__ import annotations

import logging

from aiohttp import web

from forge.learner.tinker import dispatch
from forge.learner.tinker.errors import bad_request
from forge.learner.tinker.routes_training import unload_job
from forge.learner.tinker.sessions import Session
from forge.learner.tinker.state import TinkerState

log = logging.getLogger(__name__)
MAX_TAGS = 64
CHUNK_DATA = 1024


def client_config(state: TinkerState) -> dict:
    return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
            "proto_compress_fwdbwd": False, "parallel_fwdbwd_chunks": True, "fwdbwd_max_chunk_len": CHUNK_DATA,
            "fwdbwd_max_chunk_bytes_count": state.config.max_body_bytes // 2,
            "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
            "sample_join_sampling_session": False, "sample_no_retries": False}


async def config(request: web.Request) -> web.Response:
    await dispatch.body(request)
    return web.json_response(client_config(dispatch.state_of(request)))


async def dynamic_config(request: web.Request) -> web.Response:
    await dispatch.body(request)
    return web.json_response({"refresh_interval_sec": 300, "sample_cancel_enabled": False})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def capabilities(request: web.Request) -> web.Response:
    state = dispatch.state_of(request)
    sampleable = state.sampling is not None
    return web.json_response({"supported_models": [
        {"model_name": name, "trainable": True, "sampleable": sampleable} for name in state.config.base_models]})


async def create_session(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    tags = b.items("tags", MAX_TAGS)
    if not all(isinstance(t, str) and len(t) <= 256 for t in tags):
        raise bad_request("tags must be text")
    b.text("sdk_version", required=False, max_len=64)
    session = state.registry.new_session(who, tuple(tags))
    state.counts["sessions_created"] += 1
    log.info("session %s opened", session.session_id)
    return web.json_response({"type": "create_session", "session_id": session.session_id})


async def heartbeat(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    state.registry.heartbeat(b.text("session_id"), who)
    return web.json_response({"type": "session_heartbeat"})


def end_session(state: TinkerState, session: Session, reason: str) -> None:
    """Mark ``session`` ended and unload its models after whatever they have queued."""
    session.finished = session.finished or reason
    for model_id in list(session.model_ids):
        entry = state.registry.models.get(model_id)
        if entry is not None and not entry.runner.closed:
            future = state.futures.create(entry.owner, f"unload {model_id}")
            work = unload_job(state, entry)

            async def job(future=future, work=work) -> None:
                try:
                    state.futures.finish(future, await work())
                except BaseException as exc:
                    state.futures.fail(future, exc)

            entry.runner.submit(None, future.request_id, job)
    log.info("session %s ended (%s); %d models unloading", session.session_id, reason, len(session.model_ids))


async def finish(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    session = state.registry.session(request.match_info["session_id"], who, open_only=False)
    reason = b.child("reason")
    status = reason.text("type", required=False, max_len=32) if reason is not None else None
    if session.finished is None:
        end_session(state, session, status or "finished")
    return web.json_response({})


async def telemetry(request: web.Request) -> web.Response:
    await dispatch.body(request)            # read (bounded) and dropped
    return web.json_response({"status": "accepted"})


async def cancel_future(request: web.Request) -> web.Response:
    b = await dispatch.body(request)
    b.text("request_id")
    return web.json_response({})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/healthz", healthz)
    app.router.add_get("/api/v1/get_server_capabilities", capabilities)
    app.router.add_post("/api/v1/sessions/{session_id}/finish", finish)
    for path, handler in (("client/config", config), ("client/dynamic_config", dynamic_config),
                          ("create_session", create_session), ("session_heartbeat", heartbeat),
                          ("telemetry", telemetry), ("cancel_future", cancel_future)):
        app.router.add_post(f"/api/v1/{path}", handler)
