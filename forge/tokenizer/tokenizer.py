"""A Hugging Face tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) with its chat template, loaded with the
``tokenizers`` library alone: encoding, decoding, special tokens and chat rendering, without transformers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from forge.tokenizer.chat_template import ChatTemplateError, render_chat

SHORT_TEXT = 4096           # characters tokenised on the calling thread, the GIL held
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be loaded."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def reads_string_arguments(template: str) -> bool:
    """Whether a chat template renders a tool call's arguments given as text (it tests ``is string`` or ``is
    mapping``): then they are handed over as the client sent them, and render back exactly."""
    return bool(re.search(r"arguments\s+is\s+(not\s+)?(string|mapping)", template))


def with_object_arguments(message: dict) -> dict:
    """``message`` with its tool calls' JSON-object arguments decoded, for templates that read them as an object
    (``|items``, ``|tojson``), as vLLM and transformers hand them over."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    decoded = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except ValueError:
                value = None
            if isinstance(value, dict):
                call = {**call, "function": {**function, "arguments": value}}
        decoded.append(call)
    return {**message, "tool_calls": decoded}


class Tokenizer:
    def __init__(self, backend: _HFTokenizer, config: Mapping[str, Any] | None = None,
                 chat_template: str | Mapping[str, str] | None = None) -> None:
        self.backend = backend
        self.config = dict(config or {})
        self.chat_template = chat_template
        self.special_tokens: dict[str, str] = {}
        for name in NAMED_SPECIAL_TOKENS:
            text = _token_text(self.config.get(name))
            if text is not None:
                self.special_tokens[name] = text

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.exists():
            raise TokenizerError(f"no tokenizer.json in {directory}")
        try:
            backend = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exceptions
            raise TokenizerError(f"{path} cannot be loaded: {exc}") from exc
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template: str | Mapping[str, str] | None = config.get("chat_template")
        if isinstance(template, list):
            template = {item["name"]: item["template"] for item in template}
        template_file = directory / "chat_template.jinja"
        if template_file.exists():
            template = template_file.read_text()
        return cls(backend, config, template)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return len(self)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def _special_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self.token_to_id(text)

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if len(text) <= SHORT_TEXT:
            return self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        # The batch call releases the GIL while it works (``encode`` holds it for the whole text), so other
        # threads run meanwhile; the ids are the same. A short text costs less than its hand-off to the pool.
        return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def template_for(self, tools: Sequence[Any] | None = None, name: str | None = None) -> str:
        template = self.chat_template
        if template is None:
            raise ChatTemplateError("this tokenizer has no chat template")
        if isinstance(template, str):
            return template
        if name is not None:
            if name not in template:
                raise ChatTemplateError(f"no chat template named {name!r} (have {sorted(template)})")
            return template[name]
        if tools is not None and "tool_use" in template:
            return template["tool_use"]
        if "default" in template:
            return template["default"]
        raise ChatTemplateError(f"several chat templates and none is 'default': {sorted(template)}")

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = False, max_chars: int | None = None, **variables: Any) -> str:
        """The prompt text for ``messages``: the chat template rendered as transformers renders it (keys whose
        value is None are dropped from messages; named special tokens are visible to the template). With
        ``max_chars``, rendering stops with ``RenderLimitExceeded`` as soon as the text grows longer."""
        if not messages:
            raise ChatTemplateError("cannot render an empty conversation")
        template = self.template_for(tools)
        cleaned = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        if not reads_string_arguments(template):
            cleaned = [with_object_arguments(m) for m in cleaned]
        return render_chat(template, cleaned, tools=tools,
                           add_generation_prompt=add_generation_prompt, max_chars=max_chars,
                           **{**self.special_tokens, **variables})

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            tools: Sequence[Mapping[str, Any]] | None = None,
                            add_generation_prompt: bool = False, **variables: Any) -> list[int]:
        """Token ids of the rendered chat (encoded without adding special tokens, as transformers does)."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt, **variables))
