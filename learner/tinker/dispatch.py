"""How a handler turns a checked request into work: the asking key's owner digest and JSON body, a future answered
at once (``{"request_id", "model_id"}``) whose work runs in a task of its own (``start``) or in its model's turn
(``enqueue``), and ownership of a ``tinker://`` path checked against what ``Training`` recorded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from forge.learner.tinker.bodies import Body, TinkerPath, parse_json
from forge.learner.tinker.futures import Outcome
from forge.learner.tinker.sessions import ModelEntry
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import ModelInfo, NotFound, UserError

# The request's key, as its digest (set by the auth middleware); a typed key where aiohttp has them.
OWNER: Any = web.RequestKey("tinker_owner", str) if hasattr(web, "RequestKey") else "tinker_owner"
STATE = web.AppKey("tinker_state", TinkerState)
Work = Callable[[], Awaitable[Outcome]]


def state_of(request: web.Request) -> TinkerState:
    return request.app[STATE]


def owner(request: web.Request) -> str:
    return request[OWNER]


async def body(request: web.Request) -> Body:
    return Body(parse_json(await request.read()))


def accepted(request_id: str, model_id: str | None = None, **extra: Any) -> web.Response:
    reply: dict[str, Any] = {"request_id": request_id, **extra}
    if model_id is not None:
        reply["model_id"] = model_id
    return web.json_response(reply)


def start(state: TinkerState, who: str, what: str, work: Work) -> str:
    """A future for ``work``, run now in a task of its own: its request id."""
    future = state.futures.create(who, what)
    state.futures.start(future, work)
    return future.request_id


def enqueue(state: TinkerState, entry: ModelEntry, seq: int | None, what: str, work: Work) -> web.Response:
    """Answer a future for ``work``, run in ``entry``'s turn ``seq``; a repeated ``seq`` answers the first one's."""
    known = entry.runner.known(seq)
    if known is not None:
        return accepted(known, entry.model_id)
    entry.runner.check_seq(seq)
    future = state.futures.create(entry.owner, what)

    async def job() -> None:
        try:
            outcome = await work()
        except BaseException as exc:          # the future carries it; the model's queue goes on
            state.futures.fail(future, exc)
        else:
            state.futures.finish(future, outcome)

    entry.runner.submit(seq, future.request_id, job, lambda message: state.futures.fail(future, UserError(message)))
    return accepted(future.request_id, entry.model_id)


def skip_turn(entry: ModelEntry | None, seq: int | None) -> None:
    """A request refused at the door gives up its turn, so that the model's later requests do not wait for it."""
    if entry is not None and seq is not None and not entry.runner.closed:
        entry.runner.skip(seq)


def training_path(state: TinkerState, path: TinkerPath) -> str:
    """``path`` as ``Training`` names it (a model loaded under an id the SDK made is known by ``Training``'s)."""
    return str(TinkerPath(state.registry.training_id(path.model_id), path.kind, path.name))


async def owned_model(state: TinkerState, model_id: str, who: str) -> ModelInfo:
    """``Training``'s record of a model this key owns (live or saved); NotFound otherwise."""
    entry = state.registry.models.get(model_id)
    if entry is not None:
        if entry.owner != who:
            raise NotFound(f"model {model_id!r} not found")
        return entry.info
    info = await state.call(state.training.model_info, state.registry.training_id(model_id))
    if info.owner != who:
        raise NotFound(f"model {model_id!r} not found")
    return info


async def owned_checkpoint(state: TinkerState, path: TinkerPath, who: str) -> ModelInfo:
    """The model ``path`` was saved from, when this key owns it and the checkpoint exists; NotFound otherwise."""
    info = await owned_model(state, path.model_id, who)
    checkpoints = await state.call(state.training.checkpoints, info.model_id)
    if not any(c.checkpoint_id == path.checkpoint_id for c in checkpoints):
        raise NotFound(f"checkpoint {path} not found")
    return info
