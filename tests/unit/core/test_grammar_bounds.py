"""The bounds a grammar keeps before anything compiles it (forge.sampling.bounds): counts, patterns, depth, and a
finite document for every subschema; on any JSON the check answers (a reason or None) and never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.checkpoints import resolve_model
from forge.sampling.bounds import (
    MAX_COUNT,
    MAX_REPEAT,
    MAX_SCHEMA_DEPTH,
    lark_problem,
    repeat_weight,
    schema_problem,
    schema_text_problem,
)
from forge.sampling.grammar import Grammar, GrammarError, Grammars, json_lark

CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
SELF = {"$ref": "#"}
REQUIRED_SELF = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
ITEM_SELF = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
ALL_OF_SELF = {"allOf": [{"$ref": "#"}, {"type": "object"}]}
TREE = {"$defs": {"node": {"type": "object", "properties": {"name": {"type": "string"},
                                                            "children": {"type": "array",
                                                                         "items": {"$ref": "#/$defs/node"}}},
                           "required": ["name", "children"]}},
        "$ref": "#/$defs/node"}
LINKED = {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}]}


@pytest.mark.parametrize("schema, says", [
    ({"type": "array", "minItems": 1_000_000_000}, "minItems is 1000000000"),
    ({"type": "array", "maxItems": 1_000_000}, "maxItems is 1000000"),
    ({"type": "object", "properties": {"a": {"type": "array", "minItems": MAX_COUNT + 1}}}, "#/properties/a"),
    ({"type": "string", "maxLength": 10**12}, "maxLength"),
    ({"type": "string", "pattern": "^a{1000000000}$"}, "repeats 1000000000 times"),
    ({"type": "string", "pattern": "^(a{100}){100}$"}, "repeats 10000 times"),
    ({"type": "string", "pattern": "x" * 1001}, "1001 characters"),
    ({"type": "object", "patternProperties": {"^(ab){5000}$": {}}}, "repeats 5000 times"),
    (CYCLE, "matches no finite document"),
    (SELF, "matches no finite document"),
    (REQUIRED_SELF, "matches no finite document"),
    (ITEM_SELF, "matches no finite document"),
    (ALL_OF_SELF, "matches no finite document"),
    ({"$ref": "#/$defs/missing"}, "points to no subschema"),
    ({"type": "array", "items": json.loads('{"items": ' * 40 + "{}" + "}" * 40)}, "nested 33 levels deep"),
    ([1, 2], "must be an object"),
])
def test_schemas_beyond_the_bounds_are_refused_with_the_reason(schema, says):
    problem = schema_problem(schema)
    assert problem is not None and says in problem


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}, "maxItems": MAX_COUNT}}},
    {"type": "string", "pattern": r"^\d{3}-[a-z]{2,4}(x|y){3}$"},
    {"type": "string", "pattern": r"^[]{}]{5}\p{L}{9}[a-z]{1000}$"},     # braces inside a class or \p{...}
    {"type": "string", "pattern": "^a{10}{100}$"},
    TREE, LINKED, {"type": "object", "properties": {"x": {"$ref": "#"}}},
    {"type": "array", "items": {"$ref": "#"}},                            # may be empty: []
    True, {},
])
def test_schemas_within_the_bounds_pass(schema):
    assert schema_problem(schema) is None


def test_repeat_weight_multiplies_nested_counted_repetitions_only():
    assert repeat_weight("abc") == 1
    assert repeat_weight("a{7}") == 7
    assert repeat_weight("(a{3}b){4,5}") == 15
    assert repeat_weight("a{2}{3}") == 6
    assert repeat_weight("(a*)+b?{2}") == 2
    assert repeat_weight(r"\{9999\}") == 1               # escaped braces are literals
    assert repeat_weight("[{]9999}") == 1                 # so is a brace in a class
    assert repeat_weight("a{5,}") == 5
    assert repeat_weight("((a{10}){10}){10}") == 1000 == MAX_REPEAT


def test_lark_grammars_are_checked_by_the_schemas_they_embed():
    assert lark_problem('start: "x" ' + json_lark(json.dumps({"type": "object"}))) is None
    embedded = 'start: "<call>" ' + json_lark(json.dumps({"type": "array", "minItems": 10**9})) + ' "</call>"'
    assert "minItems" in lark_problem(embedded)
    assert "nested too deeply" in lark_problem("start: %json " + "[" * 100_000)
    assert "not valid JSON" in schema_text_problem("{")


def test_every_compiler_of_a_grammar_keeps_the_bounds():
    """The engines' and the learner's Grammars refuse a grammar beyond the bounds before compiling it: the
    in-process compile of minItems 1e9 would abort the process."""
    grammars = Grammars(resolve_model("tiny").directory, 1024, (1017,))
    with pytest.raises(GrammarError, match="minItems"):
        grammars.matcher(Grammar("json_schema", json.dumps({"type": "array", "minItems": 10**9})))
    assert "no finite document" in Grammar("json_schema", json.dumps(SELF)).bounds_problem()


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=False),
                    st.text(max_size=8))
KEYWORDS = st.sampled_from(["type", "items", "properties", "required", "$ref", "$defs", "anyOf", "allOf", "oneOf",
                            "minItems", "maxItems", "pattern", "prefixItems", "not", "patternProperties", "x"])
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(KEYWORDS, st.text(max_size=4)), inner, max_size=5),
    st.sampled_from(["#", "#/$defs/a", "#/properties/x", "#/items", "#/nope"]).map(lambda ref: {"$ref": ref})),
    max_leaves=40)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(JSONISH)
def test_the_check_answers_any_json_without_raising(value):
    problem = schema_problem(value)
    assert problem is None or isinstance(problem, str)


def test_depth_limit_is_the_documented_one():
    nested: dict = {}
    for _ in range(MAX_SCHEMA_DEPTH):
        nested = {"items": nested}
    assert schema_problem(nested) is None
    assert "nested" in schema_problem({"items": nested})
