"""The bounds of a request's JSON checked the short way refuse what the long way refused, on generated input: a walk
that keeps no paths (and names a problem by walking again) against the walk that visited every value keeping them,
and a body decoded without looking for lone surrogates only where none can be in it."""

from __future__ import annotations

import json
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.gateway import json_values
from forge.gateway.errors import BadRequest
from forge.gateway.http.decode import decode_json
from forge.gateway.json_values import _shown, check_json, has_surrogate, may_hold_surrogates

from helpers.refusals import refusal

SMALL_DEPTH, SMALL_COUNT = 4, 40


def reference_check(value, root: str = "body") -> None:
    """The walk as it was: every value on the stack, each counted and checked as it comes off."""
    stack = [(value, 0, None)]
    count = 0
    while stack:
        item, depth, path = stack.pop()
        count += 1
        if count > SMALL_COUNT:
            raise BadRequest(f"{root} holds more than {SMALL_COUNT} JSON values", root)
        if isinstance(item, str):
            if has_surrogate(item):
                where = _shown(path, root)
                raise BadRequest(f"{where} contains a lone surrogate (not valid Unicode text)", where)
        elif isinstance(item, dict | list):
            if depth >= SMALL_DEPTH:
                where = _shown(path, root)
                raise BadRequest(f"{where} is nested deeper than {SMALL_DEPTH} levels, the most a request may nest",
                                 where)
            if isinstance(item, list):
                stack.extend((child, depth + 1, (path, i)) for i, child in enumerate(item))
                continue
            for key, child in item.items():
                if has_surrogate(str(key)):
                    where = _shown(path, root)
                    raise BadRequest(f"{where} contains a lone surrogate (not valid Unicode text)", where)
                stack.append((child, depth + 1, (path, str(key))))


texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=6) | st.sampled_from(["a\ud800", "\udfff"])
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts, inner, max_size=5),
                      max_leaves=60)


def small_limits():
    return mock.patch.multiple(json_values, MAX_JSON_DEPTH=SMALL_DEPTH, MAX_JSON_VALUES=SMALL_COUNT)


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_container_walk_refuses_what_the_value_walk_refused(value):
    with small_limits():
        new, old = refusal(check_json, value), refusal(reference_check, value)
    assert (new is None) == (old is None), (new, old)


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from(["surrogate", "depth", "count"]), st.randoms(use_true_random=False))
def test_a_single_problem_is_named_alike(value, problem, rng):
    """One problem planted in a value that has none: both walks name the same place."""
    planted = {"surrogate": "x\ud900", "depth": [[[[[1]]]]], "count": list(range(SMALL_COUNT + 1))}[problem]
    holder = [value, {"k": planted}] if rng.random() < 0.5 else {"first": value, "second": [planted]}
    with small_limits():
        if refusal(reference_check, value) is not None:
            return
        assert refusal(check_json, holder) == refusal(reference_check, holder)


@settings(max_examples=400, deadline=None)
@given(texts, st.booleans())
def test_a_body_is_refused_for_a_lone_surrogate_exactly_when_it_holds_one(text, ascii_only):
    raw = json.dumps({"messages": [{"role": "user", "content": text}], text: 1},
                     ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    holds = has_surrogate(text)
    assert may_hold_surrogates(raw) or not holds
    refused = refusal(decode_json, raw)
    assert (refused is not None) == holds and (not holds or "lone surrogate" in refused)
