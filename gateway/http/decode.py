"""From the bytes of an HTTP request body to checked values: the JSON, and for a model call its call and options
refused early when its text cannot fit the context. Pure functions of picklable arguments, so that the
gateway can run them in a separate process for large bodies (``OffLoop.run_isolated``)."""

from __future__ import annotations

import json
from typing import Any

from forge.gateway.errors import BadRequest, ModelNotServed
from forge.gateway.http.anthropic import parse_messages_request
from forge.gateway.http.formats import WIRE_FORMATS
from forge.gateway.json_values import check_json, may_hold_surrogates
from forge.gateway.messages import ChatCall
from forge.gateway.off_loop import INLINE_SIZE
from forge.gateway.prompt_limits import PromptLimits


def _object(pairs: list[tuple[str, Any]]) -> dict:
    return dict(pairs)


def decode_json(raw: bytes | bytearray) -> Any:
    """The JSON value of a body, refused where it is not JSON or beyond the bounds of ``json_values``. A large one is
    decoded with an object hook written in Python: where it runs in a thread, the GIL can pass to the event loop
    each time the hook runs (the C decoder alone holds the GIL from start to end)."""
    try:
        body = json.loads(raw) if len(raw) <= INLINE_SIZE else json.loads(raw, object_pairs_hook=_object)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest("the request body is nested too deeply") from exc
    check_json(body, strings=may_hold_surrogates(raw))
    return body


def check_model(body: Any, served: frozenset[str] | None) -> None:
    """ModelNotServed unless the body names no model or one in ``served`` (None: any name)."""
    name = body.get("model") if isinstance(body, dict) else None
    if served is not None and isinstance(name, str) and name not in served:
        raise ModelNotServed(name)


def _call_body(raw: bytes | bytearray, served: frozenset[str] | None) -> dict:
    """A model call's body: JSON, an object, naming a model that is served (or none)."""
    body = decode_json(raw)
    check_model(body, served)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def prepare_call(raw: bytes | bytearray, served: frozenset[str] | None, vocab_size: int, limits: PromptLimits,
                 wire: str = "chat.completions") -> tuple[ChatCall, Any]:
    """A model call's body in the format ``wire`` names, checked into its call and options, and refused as too long
    when its message text alone cannot fit."""
    call, options = WIRE_FORMATS[wire].parse(_call_body(raw, served), vocab_size, limits.context_length)
    limits.check_size(call)
    return call, options


def prepare_count(raw: bytes | bytearray, served: frozenset[str] | None, vocab_size: int, limits: PromptLimits
                  ) -> ChatCall:
    """The call of an Anthropic ``count_tokens`` body (a Messages request without ``max_tokens``)."""
    call, _options = parse_messages_request(_call_body(raw, served), vocab_size, limits.context_length,
                                            needs_max_tokens=False)
    limits.check_size(call)
    return call
