"""Calls whose arguments are written as named bare-text values (Qwen3-Coder's ``<parameter=p>``, MiniMax-M2's
``<parameter name="p">``, GLM-4.5's ``<arg_key>``/``<arg_value>``): the elements that must make up a call's body, the
template's newlines around a value, and each value typed by the tool's JSON schema (a string stays as written)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from forge.parsing.tools.base import ToolCall, Tools, new_call_id


def only_matches(pattern: re.Pattern[str], text: str) -> list[re.Match[str]] | None:
    """The matches of ``pattern`` in ``text``, which must hold nothing else but whitespace; None when it does."""
    matches, at = [], 0
    for match in pattern.finditer(text):
        if text[at:match.start()].strip():
            return None
        matches.append(match)
        at = match.end()
    return None if text[at:].strip() else matches


def trim_newlines(text: str) -> str:
    """The value without the newline the template puts on each side of it."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


def parameter_call(name: str, pairs: Iterable[tuple[str, str]], tools: Tools | None) -> ToolCall:
    """The call of function ``name`` with (parameter, bare text) ``pairs``, typed by its schema among ``tools``."""
    return ToolCall(new_call_id(), name, typed_arguments(pairs, parameter_schemas(tools, name)))


def parameter_schemas(tools: Tools | None, name: str) -> Mapping[str, Any]:
    """The JSON schemas of the parameters of function ``name`` among ``tools`` (empty if it is not there)."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            return properties if isinstance(properties, Mapping) else {}
    return {}


_INTEGER = re.compile(r"-?\d+")


def _types(schema: Any) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [k for option in schema[key] for k in _types(option)]
    return []


def typed_value(text: str, schema: Any) -> Any:
    """A parameter value written as bare text, as the type its JSON schema gives it (the first type it parses as);
    the text itself when it has no schema, is a string, or parses as none of its types."""
    for kind in _types(schema):
        if kind == "string":
            return text
        if kind == "integer" and _INTEGER.fullmatch(text.strip()):
            return int(text)
        if kind == "boolean" and text.strip() in ("true", "false"):
            return text.strip() == "true"
        if kind == "null" and text.strip() == "null":
            return None
        if kind in ("number", "object", "array"):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                continue
            wanted = {"number": (int, float), "object": (dict,), "array": (list,)}[kind]
            if isinstance(value, wanted) and not isinstance(value, bool):
                return value
    return text


def typed_arguments(pairs: Iterable[tuple[str, str]], schemas: Mapping[str, Any]) -> str:
    """The arguments of a call written as (name, bare text) pairs, as a JSON object typed by ``schemas``."""
    return json.dumps({key: typed_value(value, schemas.get(key)) for key, value in pairs}, ensure_ascii=False)
