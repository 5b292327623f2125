"""Tokenizers and chat templates: Hugging Face ``tokenizer.json`` through ``tokenizers``, templates through Jinja."""

from forge.tokenizer.chat_template import ChatTemplateError, RenderLimitExceeded, render_chat
from forge.tokenizer.tokenizer import Tokenizer, TokenizerError

__all__ = ["ChatTemplateError", "RenderLimitExceeded", "Tokenizer", "TokenizerError", "render_chat"]
