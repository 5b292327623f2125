"""``--tool-parser auto``: the parser for the served model, read from the calls its chat template writes (the
template is what the model was trained on), else from ``model_type`` in its config.json, else hermes."""

from __future__ import annotations

from collections.abc import Mapping

# The first marker found in the template decides; the more specific syntaxes come before the ones they contain.
TEMPLATE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("minimax_m2", ("<minimax:tool_call>",)),
    ("kimi_k2", ("<|tool_calls_section_begin|>",)),
    ("deepseek_v3", ("<｜tool▁calls▁begin｜>",)),
    ("glm45", ("<arg_key>",)),
    ("qwen3_coder", ("<tool_call>", "<function=")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3_json", ("<|python_tag|>",)),
    ("llama3_json", ('"parameters": dictionary of argument name',)),
    ("hermes", ("<tool_call>",)),
)

MODEL_TYPES: Mapping[str, str] = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes", "qwen3_next": "hermes",
    "llama": "llama3_json", "mistral": "mistral", "mixtral": "mistral", "mistral3": "mistral",
    "ministral": "mistral", "deepseek_v3": "deepseek_v3", "glm4_moe": "glm45", "kimi_k2": "kimi_k2",
    "minimax_m2": "minimax_m2",
}

DEFAULT = "hermes"


def pick_tool_parser(template: str | Mapping[str, str] | None, model_type: str | None = None) -> tuple[str, str]:
    """(parser name, why it was picked) for a model with chat ``template`` (or several, by name) and
    ``model_type``."""
    texts = list(template.values()) if isinstance(template, Mapping) else [template or ""]
    for name, markers in TEMPLATE_MARKERS:
        if any(all(marker in text for marker in markers) for text in texts):
            return name, "the chat template writes " + " and ".join(markers)
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type], f"config.json has model_type {model_type!r}"
    return DEFAULT, "neither the chat template nor the model type names a tool-call syntax; the default"
