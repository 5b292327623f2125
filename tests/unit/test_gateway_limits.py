"""The bound on a prompt's length in tokens from its length in characters (no token covers more than N
characters), on real tokenizers, and rendering that stops once the text is too long. (Prompts too long against a
real gateway: integration/test_gateway_limits.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from forge.assets import TINY_DIR
from forge.gateway.modelinfo import ModelInfo
from forge.gateway.token_bound import chars_per_token
from forge.tokenizer import RenderLimitExceeded, Tokenizer

TOK = Tokenizer.from_dir(TINY_DIR)
MODEL = ModelInfo.load("tiny")
LONGEST_PIECE = max(TOK.backend.get_vocab(with_added_tokens=True), key=len)     # one token, every time


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_no_token_covers_more_characters_than_the_bound():
    assert MODEL.chars_per_token == len(LONGEST_PIECE)
    assert MODEL.max_prompt_chars == (MODEL.context_length - 1) * len(LONGEST_PIECE)
    longest_text = max(len(TOK.decode([i])) for i in range(TOK.vocab_size))
    assert longest_text <= MODEL.chars_per_token


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=400) | st.lists(st.sampled_from([LONGEST_PIECE, " ", "\n\n", "12", "é"]),
                                                      min_size=1, max_size=60).map("".join))
def test_a_text_takes_at_least_its_length_over_the_bound_in_tokens(text):
    assert len(TOK.encode(text)) * MODEL.chars_per_token >= len(text)


def test_long_texts_tokenise_as_short_ones_do():
    text = "<|im_start|>user\nCompute 12 + 30, then héllo wörld. " * 200        # past the short-text path
    assert len(text) > 4096 and TOK.encode(text) == TOK.backend.encode(text, add_special_tokens=False).ids


def _wordpiece() -> HFTokenizer:
    tokenizer = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def _byte_level(normalizer: normalizers.Normalizer | None) -> HFTokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = HFTokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))} | {"ĠĠĠĠ": len(alphabet)},
                                       merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    return tokenizer


def test_pipelines_that_may_drop_text_have_no_bound():
    assert chars_per_token(Tokenizer(_byte_level(None))) == 4
    assert chars_per_token(Tokenizer(_byte_level(normalizers.NFC()))) == 16        # NFC composes up to 4 into 1
    assert chars_per_token(Tokenizer(_byte_level(normalizers.Strip()))) is None    # strips any amount of space
    assert chars_per_token(Tokenizer(_wordpiece())) is None                        # drops spaces, [UNK] words


def test_rendering_stops_once_the_text_is_too_long():
    messages = [user(f"message {i}") for i in range(5000)]
    whole = TOK.render_chat(messages[:10], add_generation_prompt=True)
    assert TOK.render_chat(messages[:10], add_generation_prompt=True, max_chars=len(whole)) == whole
    with pytest.raises(RenderLimitExceeded) as err:
        TOK.render_chat(messages[:10], add_generation_prompt=True, max_chars=len(whole) - 1)
    assert err.value.chars > len(whole) - 1
    with pytest.raises(RenderLimitExceeded) as err:
        TOK.render_chat(messages, add_generation_prompt=True, max_chars=1000)
    assert err.value.chars < 2000               # stopped after a few messages, not at the end of 5000
