"""vLLM's tokenizer endpoints, with its request and response shapes: ``POST /tokenize`` (a prompt, or chat messages
rendered with the model's chat template) and ``POST /detokenize``. They use the gateway's tokenizer only: no actor,
no session, nothing recorded."""

from __future__ import annotations

from typing import Any

from forge.gateway.errors import BadRequest
from forge.gateway.http.openai import parse_tools
from forge.gateway.http.openai_messages import parse_messages
from forge.gateway.messages import check_template_kwargs
from forge.gateway.modelinfo import ModelInfo
from forge.tokenizer import ChatTemplateError

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "tools", "add_generation_prompt", "add_special_tokens",
                             "chat_template_kwargs", "return_token_strs"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def _object(body: Any, fields: frozenset[str]) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name, value in body.items():
        if name not in fields and value is not None:
            raise BadRequest(f"{name} is not supported by this endpoint", name)
    return body


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a bool, got {type(value).__name__}", name)
    return value


def tokenize(model: ModelInfo, body: Any) -> dict:
    body = _object(body, TOKENIZE_FIELDS)
    tokenizer = model.tokenizer
    if ("prompt" in body) == ("messages" in body):
        raise BadRequest("give either prompt (a string) or messages (a chat)", "prompt")
    if "prompt" in body:
        if not isinstance(body["prompt"], str):
            raise BadRequest("prompt must be a string", "prompt")
        ids = tokenizer.encode(body["prompt"], add_special_tokens=_flag(body, "add_special_tokens", True))
    else:
        messages = parse_messages(body["messages"])
        variables = check_template_kwargs(body.get("chat_template_kwargs"))
        try:
            text = tokenizer.render_chat(messages, parse_tools(body),
                                         add_generation_prompt=_flag(body, "add_generation_prompt", True), **variables)
        except (ChatTemplateError, TypeError, ValueError) as exc:
            raise BadRequest(f"the messages cannot be rendered with the model's chat template: {exc}",
                             "messages") from exc
        except RecursionError as exc:
            raise BadRequest("the messages or tools are nested too deeply", "messages") from exc
        ids = tokenizer.encode(text, add_special_tokens=_flag(body, "add_special_tokens", False))
    strings = [tokenizer.id_to_token(i) or "" for i in ids] if _flag(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": model.context_length, "tokens": ids, "token_strs": strings}


def detokenize(model: ModelInfo, body: Any) -> dict:
    body = _object(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("tokens must be a list of token ids", "tokens")
    bad = [t for t in tokens if not 0 <= t < model.vocab_size]
    if bad:
        raise BadRequest(f"token ids outside the vocabulary [0, {model.vocab_size}): {bad[:5]}", "tokens")
    return {"prompt": model.tokenizer.decode(tokens)}
