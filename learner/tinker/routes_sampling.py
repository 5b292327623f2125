"""The sampling and futures endpoints: create_sampling_session (on a base model or a saved checkpoint this key
owns), samplers/{id}, asample (sequences from the actors, the prompt's log-probs from the training side, one
sequence id per sample), retrieve_future (held up to the poll hold, then ``try_again``) and retrieve_futures (a
sampling session's completion queue)."""

from __future__ import annotations

from aiohttp import web

from forge.learner.tinker import dispatch
from forge.learner.tinker.bodies import Body, TinkerPath, parse_path
from forge.learner.tinker.errors import bad_request, not_found
from forge.learner.tinker.futures import Future, Outcome
from forge.learner.tinker.sessions import SamplerEntry
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import SampleParams
from forge.learner.tinker.wire import PROTOBUF, encode_sample

MAX_SAMPLES = 128
MAX_PROMPT = 1 << 20
MAX_TOPK = 20
MAX_STOPS = 64
CLONE_BLOCK = 1_000_000_000


async def create_sampling_session(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    session = state.registry.session(b.text("session_id"), who)
    seq = b.integer("sampling_session_seq_id", required=True, low=0, high=2**62)
    path = None if b.data.get("model_path") is None else parse_path(b.data["model_path"])
    if path is None:
        base = state.check_base_model(b.data.get("base_model"))
    else:
        base = (await dispatch.owned_checkpoint(state, path, who)).base_model
    sampler = state.registry.add_sampler(session, base, None if path is None else str(path), seq)
    return web.json_response({"type": "create_sampling_session", "sampling_session_id": sampler.sampler_id})


async def get_sampler(request: web.Request) -> web.Response:
    state, who = dispatch.state_of(request), dispatch.owner(request)
    sampler = state.registry.sampler(request.match_info["sampler_id"], who)
    return web.json_response({"sampler_id": sampler.sampler_id, "base_model": sampler.base_model,
                              "model_path": sampler.model_path})


def sample_params(b: Body) -> SampleParams:
    """The sampling parameters; ``stop``: None stops at the end-of-sequence token only, text or a list of texts or
    of token ids stop there too, and ``[]`` stops nowhere, not even at the end-of-sequence token (the SDK's
    meaning)."""
    stop = b.data.get("stop")
    if stop is None:
        return _params(b, (), ())
    if stop == []:
        return _params(b, (), (), stop_at_eos=False)
    if isinstance(stop, str):
        return _params(b, (stop,), ())
    if isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(s, str) for s in stop):
        return _params(b, tuple(stop), ())
    if isinstance(stop, list) and len(stop) <= MAX_STOPS and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in stop):
        return _params(b, (), tuple(stop))
    raise bad_request(f"sampling_params.stop must be text, a list of texts or a list of token ids (at most "
                      f"{MAX_STOPS})")


def _params(b: Body, strings: tuple[str, ...], tokens: tuple[int, ...], stop_at_eos: bool = True) -> SampleParams:
    top_k = b.integer("top_k", default=-1, low=-1, high=1 << 20)
    return SampleParams(max_tokens=b.integer("max_tokens", low=1, high=1 << 20),
                        temperature=b.number("temperature", 1.0, low=0.0, high=100.0),
                        top_k=-1 if top_k == 0 else top_k, top_p=b.number("top_p", 1.0, low=0.0, high=1.0),
                        seed=b.integer("seed", low=0, high=2**64 - 1), stop_strings=strings, stop_tokens=tokens,
                        stop_at_eos=stop_at_eos)


def prompt_tokens(b: Body) -> list[int]:
    prompt = b.child("prompt", required=True)
    assert prompt is not None
    tokens: list[int] = []
    for i, chunk in enumerate(prompt.items("chunks", 4096)):
        chunk_body = Body(chunk, f"prompt.chunks[{i}]")
        if chunk_body.data.get("type", "encoded_text") != "encoded_text":
            raise bad_request(f"prompt.chunks[{i}]: only token chunks (encoded_text) are served")
        values = chunk_body.items("tokens", MAX_PROMPT)
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in values):
            raise bad_request(f"prompt.chunks[{i}].tokens must be token ids")
        tokens += values
    if not tokens or len(tokens) > MAX_PROMPT:
        raise bad_request(f"the prompt must hold 1 to {MAX_PROMPT} tokens")
    return tokens


def refuse_unserved(b: Body) -> None:
    for key in ("topk_sample_logprobs", "prompt_alt_tokens_k"):
        if b.integer(key, default=0, low=0):
            raise bad_request(f"{key} is not served")
    if b.data.get("target_prompt_logprobs") is not None:
        raise bad_request("target_prompt_logprobs is not served")
    if b.flag("record_stability_info"):
        raise bad_request("record_stability_info is not served")


def sampler_of(state: TinkerState, who: str, b: Body) -> tuple[str, str | None, SamplerEntry | None]:
    """The base model and sampler path a sample request names: its sampling session's, or its own."""
    if b.data.get("sampling_session_id") is not None:
        sampler = state.registry.sampler(b.data["sampling_session_id"], who)
        return sampler.base_model, sampler.model_path, sampler
    if b.data.get("model_path") is not None:
        path: TinkerPath = parse_path(b.data["model_path"])
        entry = state.registry.models.get(path.model_id)
        if entry is None or entry.owner != who:
            raise not_found(f"model {path.model_id!r} (for a saved model's weights, create a sampling session)")
        return entry.info.base_model, str(path), None
    return state.check_base_model(b.data.get("base_model")), None, None


async def asample(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    base, sampler_path, sampler = sampler_of(state, who, b)
    if state.sampling is None:
        raise bad_request("sampling is not served: this server has no actors (--actor)")
    count = b.integer("num_samples", default=1, low=1, high=MAX_SAMPLES)
    params = sample_params(b.child("sampling_params", required=True))
    prompt = prompt_tokens(b)
    refuse_unserved(b)
    want_logprobs = b.flag("prompt_logprobs")
    top_k = b.integer("topk_prompt_logprobs", default=0, low=0, high=MAX_TOPK)
    last_n = b.integer("prompt_logprobs_last_n", low=1, high=max(1, len(prompt) - 1))
    seq = b.integer("seq_id", default=0, low=0, high=2**62)
    sampling = state.sampling

    async def work() -> Outcome:
        sequences = await sampling.sample(base, sampler_path, prompt, count, params)
        if len(sequences) != count:
            raise RuntimeError(f"the actors returned {len(sequences)} sequences for {count} samples")
        logprobs = topk = None
        if want_logprobs or top_k:
            logprobs, topk = await state.call(state.training.prompt_logprobs, base, sampler_path, prompt, top_k)
            if last_n is not None:
                cut = len(prompt) - last_n
                logprobs = [None] * cut + list(logprobs[cut:])
                topk = None if topk is None else [None] * cut + list(topk[cut:])
        state.counts["samples"] += count
        return Outcome(proto=encode_sample(sequences, logprobs if want_logprobs else None, topk, top_k))

    future = state.futures.create(who, f"sample {base}")
    if sampler is not None:
        future.listeners.append(lambda f: notify(sampler, seq // CLONE_BLOCK, f))
    state.futures.start(future, work)
    ids = [f"{future.request_id}:{i}" for i in range(count)]
    return dispatch.accepted(future.request_id, sample_sequence_ids=ids)


def notify(sampler: SamplerEntry, clone: int, future: Future) -> None:
    assert future.outcome is not None
    if future.outcome.failed:
        sampler.completions.add(clone, {"state": "failed", "request_id": future.request_id})
    else:
        sampler.completions.add(clone, {"state": "finished", "request_id": future.request_id,
                                        "response_payload_uncompressed_size": future.outcome.size()})


async def retrieve_future(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    request_id = b.text("request_id", max_len=128)
    b.flag("allow_metadata_only")
    outcome = await state.futures.wait(request_id, who, state.config.poll_hold_s)
    if outcome is None:
        return web.json_response({"type": "try_again", "request_id": request_id, "queue_state": "active"})
    if outcome.proto is not None:
        return web.Response(body=outcome.proto, content_type=PROTOBUF)
    return web.json_response(outcome.json)


async def retrieve_futures(request: web.Request) -> web.Response:
    state, who, b = dispatch.state_of(request), dispatch.owner(request), await dispatch.body(request)
    target = b.child("target", required=True)
    assert target is not None
    sampler = state.registry.sampler(target.text("sampling_session_id"), who)
    clone = target.integer("cloned_sampler_id", default=0, low=0, high=CLONE_BLOCK)
    prev = b.integer("prev_cursor", default=0, low=0, high=2**62)
    hold = b.number("timeout", state.config.poll_hold_s, low=0.0, high=state.config.poll_hold_s)
    b.items("retrieved_request_ids", 100_000)
    completions, cursor = await sampler.completions.poll(prev, clone, hold)
    return web.json_response({"completions": completions, "cursor": cursor})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/samplers/{sampler_id}", get_sampler)
    for path, handler in (("create_sampling_session", create_sampling_session), ("asample", asample),
                          ("retrieve_future", retrieve_future), ("retrieve_futures", retrieve_futures)):
        app.router.add_post(f"/api/v1/{path}", handler)
