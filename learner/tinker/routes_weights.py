"""The weights endpoints: save_weights (adapter and optimizer state under a name), load_weights (onto a model in its
turn, or as a new model the SDK names ``SESSION:train:N``, with or without the optimizer's state), and
save_weights_for_sampler (a named sampler checkpoint answering its ``tinker://`` path, or, unnamed, a sampling
session on fresh sampler weights). Paths are checked at the door; whose checkpoint a path names is checked in the
request's turn against ``Training``'s records."""

from __future__ import annotations

from aiohttp import web

from forge.learner.tinker import dispatch
from forge.learner.tinker.bodies import Body, check_name, parse_path
from forge.learner.tinker.errors import ApiError, bad_request
from forge.learner.tinker.futures import Outcome
from forge.learner.tinker.ordering import OrderedRunner
from forge.learner.tinker.routes_training import MAX_SEQ, check_optimizer, model_turn
from forge.learner.tinker.sessions import ModelEntry
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import UserError

MAX_METADATA = 64
MAX_TTL_S = 10 * 365 * 86400


async def forget_sampler(state: TinkerState, path: str) -> None:
    """The actors stop serving what they loaded from ``path`` (a checkpoint deleted or written again), so that a
    sample asked for after this reads the path again: the new weights, or NotFound."""
    if state.sampling is not None:
        await state.sampling.forget(path)


def saved_name(b: Body) -> str | None:
    name = b.text("path", required=False, max_len=128)
    b.integer("ttl_seconds", low=0, high=MAX_TTL_S)
    metadata = b.child("user_metadata")
    if metadata is not None and (len(metadata.data) > MAX_METADATA
                                 or not all(isinstance(v, str) and len(v) <= 512 for v in metadata.data.values())):
        raise bad_request(f"user_metadata: at most {MAX_METADATA} text values")
    return None if name is None else check_name(name)


async def save_weights(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    entry, seq = model_turn(state, who, b)
    try:
        name, overwrite = saved_name(b), b.flag("overwrite")
    except ApiError:
        dispatch.skip_turn(entry, seq)
        raise

    async def work() -> Outcome:
        if name is not None and not overwrite:
            existing = await state.call(state.training.checkpoints, entry.training_id)
            if any(c.checkpoint_id == f"weights/{name}" for c in existing):
                raise UserError(f"checkpoint weights/{name} exists (save with overwrite=True to replace it)")
        checkpoint = await state.call(state.training.save_state, entry.training_id, name)
        await forget_sampler(state, checkpoint.path)
        state.counts["checkpoints_saved"] += 1
        return Outcome(json={"path": checkpoint.path, "type": "save_weights"})

    return dispatch.enqueue(state, entry, seq, f"save_weights {entry.model_id}", work)


async def save_weights_for_sampler(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    entry, seq = model_turn(state, who, b)
    try:
        name = saved_name(b)
        sampler_seq = b.integer("sampling_session_seq_id", low=0, high=MAX_SEQ)
        if b.data.get("kind", "snapshot") not in ("snapshot", "inflight"):
            raise bad_request("kind must be 'snapshot' or 'inflight'")
        if name is None and sampler_seq is None:
            raise bad_request("give a path (a name) or a sampling_session_seq_id")
    except ApiError:
        dispatch.skip_turn(entry, seq)
        raise
    session = state.registry.sessions.get(entry.session_id)

    async def work() -> Outcome:
        checkpoint = await state.call(state.training.save_sampler, entry.training_id, name)
        await forget_sampler(state, checkpoint.path)
        reply = {"path": checkpoint.path, "type": "save_weights_for_sampler"}
        if name is None and session is not None:
            sampler = state.registry.add_sampler(session, entry.info.base_model, checkpoint.path, sampler_seq)
            reply["sampling_session_id"] = sampler.sampler_id
        return Outcome(json=reply)

    return dispatch.enqueue(state, entry, seq, f"save_weights_for_sampler {entry.model_id}", work)


async def load_weights(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    if b.data.get("session_id") is not None:
        return load_as_new_model(state, who, b)
    entry, seq = model_turn(state, who, b)
    try:
        path, optimizer = parse_path(b.data.get("path"), ("weights",)), b.flag("optimizer")
        if b.data.get("weights_access_token") is not None:
            raise bad_request("weights_access_token is not served: load your own checkpoints")
    except ApiError:
        dispatch.skip_turn(entry, seq)
        raise

    async def work() -> Outcome:
        await dispatch.owned_checkpoint(state, path, who)
        await state.call(state.training.load_state, entry.training_id, dispatch.training_path(state, path), optimizer)
        return Outcome(json={"path": str(path), "model_id": entry.model_id, "type": "load_weights"})

    return dispatch.enqueue(state, entry, seq, f"load_weights {entry.model_id}", work)


def load_as_new_model(state: TinkerState, who: str, b: Body) -> web.Response:
    """A new model holding a saved state: the SDK's create_training_client_from_state."""
    session = state.registry.session(b.text("session_id"), who)
    model_seq = b.integer("model_seq_id", required=True, low=0, high=MAX_SEQ)
    path, optimizer = parse_path(b.data.get("path"), ("weights",)), b.flag("optimizer")
    base = None if b.data.get("base_model") is None else state.check_base_model(b.data["base_model"])
    check_optimizer(b.child("optimizer_config"))
    if b.data.get("weights_access_token") is not None:
        raise bad_request("weights_access_token is not served: load your own checkpoints")
    model_id = f"{session.session_id}:train:{model_seq}"
    key = (session.session_id, model_seq)
    if key in state.registry.creations:
        return dispatch.accepted(state.registry.creations[key], model_id)

    async def work() -> Outcome:
        source = await dispatch.owned_checkpoint(state, path, who)
        info = await state.call(state.training.create_model, who, base or source.base_model, source.lora)
        try:
            await state.call(state.training.load_state, info.model_id, dispatch.training_path(state, path), optimizer)
        except BaseException:
            await state.call(state.training.unload, info.model_id)
            raise
        state.registry.add_model(ModelEntry(model_id, who, session.session_id, info, OrderedRunner(model_id)))
        state.counts["models_created"] += 1
        return Outcome(json={"path": str(path), "model_id": model_id, "type": "load_weights"})

    request_id = state.registry.creations[key] = dispatch.start(state, who, f"load_weights {model_id}", work)
    return dispatch.accepted(request_id, model_id)


def add_routes(app: web.Application) -> None:
    for path, handler in (("save_weights", save_weights), ("load_weights", load_weights),
                          ("save_weights_for_sampler", save_weights_for_sampler)):
        app.router.add_post(f"/api/v1/{path}", handler)
