"""Rendering chat messages with a model's Jinja chat template, exactly as transformers' ``apply_chat_template``.

Templates from checkpoints are untrusted code: they run in Jinja's immutable sandbox with the same extras that
transformers provides (``tojson`` without HTML escaping, ``raise_exception``, ``strftime_now``, loop controls and
the ``{% generation %}`` tag), so a template renders here byte for byte as it does there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from itertools import islice
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Older names under which a message's reasoning may arrive; templates read ``reasoning_content``.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
RENDER_BATCH = 32          # pieces of rendered text joined between checks of the length


class ChatTemplateError(ValueError):
    """The template could not be rendered for these messages (the template's own message when it raised one)."""


class RenderLimitExceeded(Exception):
    """The rendered text grew past the ``max_chars`` it was given; rendering stopped there."""

    def __init__(self, chars: int, max_chars: int) -> None:
        super().__init__(f"the rendered text exceeds {max_chars} characters (stopped at {chars})")
        self.chars = chars
        self.max_chars = max_chars


class GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` marks assistant text; rendering keeps the body unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja's declared attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore-prefixed attributes (no route into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


DICT_ATTRIBUTES = frozenset(dir(dict))


class _ChatEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, reaching a plain dict's keys as attributes (``message.role``) straight away: Jinja
    tries the attribute first, and a dict has none by that name, so the sandbox's way raises an AttributeError
    before it looks the key up. The same value comes back either way; every other lookup is the sandbox's."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute in obj and attribute not in DICT_ATTRIBUTES:
            return obj[attribute]
        return super().getattr(obj, attribute)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    env = _ChatEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=dict, namespace=_Namespace)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not parse: {exc}") from exc


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """Deep copy into plain dicts and lists, so the template never sees (or edits) the caller's objects."""
    kind = type(value)
    if kind in _SCALARS:                # the usual kinds first: the abstract checks below cost more
        return value
    if kind is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, Sequence):
        return [_plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    return _plain(dump()) if callable(dump) else value


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    max_chars: int | None = None,
    **variables: Any,
) -> str:
    """Render ``messages`` (OpenAI-style dicts) and ``tools`` (JSON schemas) with ``template``.

    Extra ``variables`` (special tokens, flags such as ``enable_thinking``) are visible to the template. With
    ``max_chars``, the text is rendered in batches of pieces and ``RenderLimitExceeded`` raised after the first batch
    that makes it longer, so an oversized conversation costs little more template work than the limit."""
    chat = [_alias_reasoning(m) for m in _plain(list(messages))]
    for message in chat:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be mappings, got {message!r}")
    context = dict(messages=chat, tools=_plain(list(tools)) if tools is not None else None, documents=None,
                   add_generation_prompt=add_generation_prompt, **_plain(variables))
    try:
        if max_chars is None:
            return compile_template(template).render(**context)
        pieces = compile_template(template).generate(**context)
        parts, chars = [], 0
        while batch := list(islice(pieces, RENDER_BATCH)):
            part = "".join(batch)
            chars += len(part)
            if chars > max_chars:
                raise RenderLimitExceeded(chars, max_chars)
            parts.append(part)
        return "".join(parts)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(str(exc)) from exc
