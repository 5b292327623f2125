"""The grammars a request asks for in every wire format's structured-output field: a JSON schema (OpenAI's named
form, or bare), or any JSON object."""

from __future__ import annotations

import json
from typing import Any

from forge.gateway.errors import BadRequest
from forge.v1 import common_pb2


def schema_grammar(schema: Any, param: str, where: str) -> common_pb2.Grammar:
    """The grammar of a JSON schema sent at ``where``, errors naming ``param`` (its bounds are checked with the
    sampling parameters; it is compiled before the call is routed, ``forge.gateway.grammar_check``)."""
    if not isinstance(schema, dict):
        raise BadRequest(f"{where} is required: the JSON schema (an object) the output must match", param)
    try:
        return common_pb2.Grammar(json_schema=json.dumps(schema))
    except RecursionError:
        raise BadRequest(f"{where}: the JSON schema is nested too deeply", param) from None


def json_object_grammar() -> common_pb2.Grammar:
    return common_pb2.Grammar(json_object=True)


def named_schema_grammar(spec: dict, param: str, where: str) -> common_pb2.Grammar:
    """The grammar of OpenAI's named JSON schema (``name``, ``description``, ``schema``, ``strict``) at ``where``;
    ``strict`` changes nothing: the schema is always followed."""
    for name, kinds, what in (("name", str, "a string"), ("description", str, "a string"),
                              ("strict", bool, "a boolean")):
        if not isinstance(spec.get(name), kinds | None):
            raise BadRequest(f"{where}.{name} must be {what}", param)
    return schema_grammar(spec.get("schema"), param, f"{where}.schema")
