"""The REST endpoints the SDK's RestClient (and tinker-cookbook's resume and clean-up) use: training_runs (a key's
models, live or saved), training_runs/{id}, its checkpoints (listed and deleted), checkpoints (all of a key's), and
weights_info (what a saved path was trained on). Another key's model reads as absent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from forge.learner.tinker import dispatch
from forge.learner.tinker.bodies import TinkerPath, check_model_id, parse_path
from forge.learner.tinker.errors import bad_request
from forge.learner.tinker.routes_weights import forget_sampler
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import Checkpoint, ModelInfo, Training

MAX_LIMIT = 1000


def iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()


def checkpoint_json(c: Checkpoint) -> dict[str, Any]:
    return {"checkpoint_id": c.checkpoint_id, "checkpoint_type": c.kind, "time": iso(c.created_unix),
            "tinker_path": c.path, "size_bytes": c.size_bytes, "public": c.public}


def run_json(state: TinkerState, info: ModelInfo, checkpoints: list[Checkpoint]) -> dict[str, Any]:
    latest = {kind: max((c for c in checkpoints if c.kind == kind), key=lambda c: c.created_unix, default=None)
              for kind in ("training", "sampler")}
    entry = state.registry.models.get(state.registry.wire_id(info.model_id))
    last = max([entry.last_request if entry else 0.0, *(c.created_unix for c in checkpoints)]) or state.started
    return {"training_run_id": info.model_id, "base_model": info.base_model, "model_owner": info.owner,
            "is_lora": True, "lora_rank": info.lora.rank, "last_request_time": iso(last),
            "last_checkpoint": checkpoint_json(latest["training"]) if latest["training"] else None,
            "last_sampler_checkpoint": checkpoint_json(latest["sampler"]) if latest["sampler"] else None}


def page(request: web.Request) -> tuple[int, int]:
    try:
        limit, offset = int(request.query.get("limit", 20)), int(request.query.get("offset", 0))
    except ValueError:
        raise bad_request("limit and offset must be integers") from None
    if not (1 <= limit <= MAX_LIMIT and offset >= 0):
        raise bad_request(f"limit must be in [1, {MAX_LIMIT}] and offset >= 0")
    return limit, offset


def runs_of(training: Training, owner: str) -> list[tuple[ModelInfo, list[Checkpoint]]]:
    return [(info, training.checkpoints(info.model_id)) for info in training.models(owner)]


async def training_runs(request: web.Request) -> web.Response:
    state, who = dispatch.state_of(request), dispatch.owner(request)
    limit, offset = page(request)
    runs = await state.call(runs_of, state.training, who)
    shown = [run_json(state, info, cps) for info, cps in runs[offset:offset + limit]]
    return web.json_response({"training_runs": shown,
                              "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}})


async def owned_run(request: web.Request) -> tuple[TinkerState, ModelInfo, list[Checkpoint]]:
    state, who = dispatch.state_of(request), dispatch.owner(request)
    info = await dispatch.owned_model(state, check_model_id(request.match_info["model_id"]), who)
    return state, info, await state.call(state.training.checkpoints, info.model_id)


async def training_run(request: web.Request) -> web.Response:
    state, info, checkpoints = await owned_run(request)
    return web.json_response(run_json(state, info, checkpoints))


async def checkpoints(request: web.Request) -> web.Response:
    _, _, found = await owned_run(request)
    return web.json_response({"checkpoints": [checkpoint_json(c) for c in found], "cursor": None})


async def delete_checkpoint(request: web.Request) -> web.Response:
    model_id = check_model_id(request.match_info["model_id"])
    path = parse_path(f"tinker://{model_id}/{request.match_info['kind']}/{request.match_info['name']}")
    state, who = dispatch.state_of(request), dispatch.owner(request)
    info = await dispatch.owned_checkpoint(state, path, who)
    await state.call(state.training.delete_checkpoint, info.model_id, path.checkpoint_id)
    await forget_sampler(state, str(TinkerPath(info.model_id, path.kind, path.name)))
    state.counts["checkpoints_deleted"] += 1
    return web.json_response({})


async def user_checkpoints(request: web.Request) -> web.Response:
    state, who = dispatch.state_of(request), dispatch.owner(request)
    limit, offset = page(request)
    runs = await state.call(runs_of, state.training, who)
    found = sorted((c for _, cps in runs for c in cps), key=lambda c: c.created_unix, reverse=True)
    return web.json_response({"checkpoints": [checkpoint_json(c) for c in found[offset:offset + limit]],
                              "cursor": {"offset": offset, "limit": limit, "total_count": len(found)}})


async def weights_info(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    path = parse_path(b.text("tinker_path"))
    info = await dispatch.owned_checkpoint(state, path, who)
    return web.json_response({"base_model": info.base_model, "optimizer_config": {"type": "adamw"}, "is_lora": True,
                              "lora_rank": info.lora.rank, "train_unembed": info.lora.train_unembed,
                              "train_mlp": info.lora.train_mlp, "train_attn": info.lora.train_attn})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/training_runs", training_runs)
    app.router.add_get("/api/v1/training_runs/{model_id}", training_run)
    app.router.add_get("/api/v1/training_runs/{model_id}/checkpoints", checkpoints)
    app.router.add_delete("/api/v1/training_runs/{model_id}/checkpoints/{kind}/{name}", delete_checkpoint)
    app.router.add_get("/api/v1/checkpoints", user_checkpoints)
    app.router.add_post("/api/v1/weights_info", weights_info)
