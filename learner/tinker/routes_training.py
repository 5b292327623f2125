"""The training endpoints: create_model, get_info, unload_model, forward_backward (forward too), optim_step. Each
request is checked whole before it is accepted; an accepted one runs in its model's turn on the training thread and
answers through its future."""

from __future__ import annotations

from aiohttp import web

from forge.learner.tinker import dispatch
from forge.learner.tinker.bodies import Body, check_model_id
from forge.learner.tinker.errors import ApiError, bad_request
from forge.learner.tinker.futures import Outcome
from forge.learner.tinker.ordering import OrderedRunner
from forge.learner.tinker.sessions import ModelEntry
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import AdamSpec, LoraSpec
from forge.learner.tinker.wire import ForwardRequest, decode_forward, decompress, encode_forward

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce")
MAX_RANK = 1024
MAX_SEQ = 2**62


def lora_spec(body: Body | None) -> LoraSpec:
    if body is None:
        raise bad_request("lora_config is required: this server trains LoRA adapters only")
    spec = LoraSpec(rank=body.integer("rank", required=True, low=1, high=MAX_RANK),
                    seed=body.integer("seed", low=-(2**63), high=2**63 - 1),
                    train_mlp=body.flag("train_mlp", True), train_attn=body.flag("train_attn", True),
                    train_unembed=body.flag("train_unembed", True))
    if not (spec.train_mlp or spec.train_attn or spec.train_unembed):
        raise bad_request("lora_config trains nothing: set one of train_mlp, train_attn, train_unembed")
    return spec


def check_optimizer(body: Body | None) -> None:
    if body is not None and body.data.get("type", "adamw") != "adamw":
        raise bad_request(f"optimizer {body.data.get('type')!r} is not served (adamw only)")


def model_turn(state: TinkerState, who: str, b: Body) -> tuple[ModelEntry, int | None]:
    entry = state.registry.model(check_model_id(b.data.get("model_id")), who)
    return entry, b.integer("seq_id", low=0, high=MAX_SEQ)


async def create_model(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    session = state.registry.session(b.text("session_id"), who)
    model_seq = b.integer("model_seq_id", required=True, low=0, high=MAX_SEQ)
    base = state.check_base_model(b.text("base_model"))
    lora = lora_spec(b.child("lora_config"))
    check_optimizer(b.child("optimizer_config"))
    key = (session.session_id, model_seq)
    if key in state.registry.creations:
        return dispatch.accepted(state.registry.creations[key])

    async def work() -> Outcome:
        info = await state.call(state.training.create_model, who, base, lora)
        state.registry.add_model(ModelEntry(info.model_id, who, session.session_id, info, OrderedRunner(info.model_id)))
        state.counts["models_created"] += 1
        return Outcome(json={"model_id": info.model_id, "type": "create_model"})

    request_id = state.registry.creations[key] = dispatch.start(state, who, f"create_model {base}", work)
    return dispatch.accepted(request_id)


async def get_info(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    entry = state.registry.model(check_model_id(b.data.get("model_id")), who)
    info = entry.info
    return web.json_response({
        "type": "get_info", "model_id": entry.model_id, "is_lora": True, "lora_rank": info.lora.rank,
        "model_name": info.model_name, "optimizer_config": {"type": "adamw"},
        "model_data": {"arch": None, "model_name": info.model_name, "tokenizer_id": info.tokenizer_id}})


def unload_job(state: TinkerState, entry: ModelEntry) -> dispatch.Work:
    async def work() -> Outcome:
        await state.call(state.training.unload, entry.training_id)
        state.registry.drop_model(entry.model_id)
        entry.runner.retire(f"model {entry.model_id} was unloaded")
        return Outcome(json={"model_id": entry.model_id, "type": "unload_model"})

    return work


async def unload_model(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    entry = state.registry.model(check_model_id(b.data.get("model_id")), who)
    return dispatch.enqueue(state, entry, None, f"unload {entry.model_id}", unload_job(state, entry))


def decoded_forward(state: TinkerState, raw: bytes, request: web.Request) -> ForwardRequest:
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type != "application/x-protobuf":
        raise ApiError(415, "forward_backward takes a protobuf body (Content-Type: application/x-protobuf)")
    return decode_forward(decompress(raw, request.headers.get("Content-Encoding"), state.config.max_body_bytes))


async def forward_backward(request: web.Request) -> web.Response:
    state, who = dispatch.state_of(request), dispatch.owner(request)
    forward = decoded_forward(state, await request.read(), request)
    entry = state.registry.model(check_model_id(forward.model_id), who)
    if forward.loss_fn not in LOSSES:
        dispatch.skip_turn(entry, forward.seq_id)
        raise bad_request(f"loss_fn {forward.loss_fn!r} is not served (one of {', '.join(LOSSES)}; a custom loss "
                          "runs client-side through cross_entropy)")
    backward = not forward.forward_only

    async def work() -> Outcome:
        result = await state.call(state.training.forward, entry.training_id, forward.data, forward.loss_fn,
                                  forward.loss_fn_config, backward)
        state.counts["tokens_trained" if backward else "tokens_forward"] += forward.tokens
        return Outcome(proto=encode_forward(result))

    what = f"{'forward_backward' if backward else 'forward'} {entry.model_id}"
    return dispatch.enqueue(state, entry, forward.seq_id, what, work)


def adam_spec(b: Body) -> AdamSpec:
    if b.data.get("optimizer_params") is not None:
        raise bad_request("optimizer_params: only Adam (adam_params) is served")
    params = b.child("adam_params") or b.child("optim_params", required=True)
    assert params is not None
    return AdamSpec(learning_rate=params.number("learning_rate", 1e-4, low=0.0),
                    beta1=params.number("beta1", 0.9, low=0.0, high=1.0, high_open=True),
                    beta2=params.number("beta2", 0.95, low=0.0, high=1.0, high_open=True),
                    eps=params.number("eps", 1e-12, low=0.0),
                    weight_decay=params.number("weight_decay", 0.0, low=0.0),
                    grad_clip_norm=params.number("grad_clip_norm", 0.0, low=0.0))


async def optim_step(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    entry, seq = model_turn(state, who, b)
    try:
        adam = adam_spec(b)
    except ApiError:
        dispatch.skip_turn(entry, seq)
        raise

    async def work() -> Outcome:
        metrics = await state.call(state.training.optim_step, entry.training_id, adam)
        state.counts["optim_steps"] += 1
        return Outcome(json={"metrics": {k: float(v) for k, v in metrics.items()}, "type": "optim_step"})

    return dispatch.enqueue(state, entry, seq, f"optim_step {entry.model_id}", work)


def add_routes(app: web.Application) -> None:
    for path, handler in (("create_model", create_model), ("get_info", get_info), ("unload_model", unload_model),
                          ("forward_backward", forward_backward), ("optim_step", optim_step)):
        app.router.add_post(f"/api/v1/{path}", handler)
