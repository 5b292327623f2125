"""The bound on a prompt's length in tokens from its length in characters (no token covers more than N
characters), on real tokenizers, and rendering that stops once the text is too long; and the gateway's bounds for a
model with a 256k-token window: a 200k-token prompt passes them all, one past the window is refused as
``context_length_exceeded``, a multi-megabyte one before it is rendered or tokenised. (Prompts too long against a
real gateway: integration/test_gateway_limits.py.)"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from forge.assets import TINY_DIR
from forge.gateway.calls import CallRunner
from forge.gateway.errors import BadRequest
from forge.gateway.http.decode import prepare_call
from forge.gateway.messages import ChatCall
from forge.gateway.metrics import Metrics
from forge.gateway.modelinfo import ModelInfo
from forge.gateway.token_bound import chars_per_token
from forge.parsing.completion import CompletionParser
from forge.tokenizer import RenderLimitExceeded, Tokenizer

from helpers.random_model import random_tiny

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


LONG_CONTEXT = 256 * 1024
WORDS = ("ledger", "amber", "north", "valve", "copper", "quiet", "seven", "harbor", "linen", "orbit", "maple", "delta")


@pytest.fixture(scope="module")
def long_model(tmp_path_factory) -> ModelInfo:
    """What the gateway loads for the tiny model stretched to a 256k-token window (as a long-context run serves it)."""
    return ModelInfo.load(str(random_tiny(tmp_path_factory.mktemp("long"), context=LONG_CONTEXT)))


def chat_body(messages: list[dict], **extra: object) -> bytes:
    return json.dumps({"model": "forge-tiny", "messages": messages, "max_tokens": 64, **extra}).encode()


def runner_for(model: ModelInfo) -> CallRunner:
    """The gateway's call runner, for what it does before a call reaches an actor: render, then bound the ids."""
    return CallRunner(model, None, None, CompletionParser(), Metrics())


def prompt_ids(model: ModelInfo, call: ChatCall) -> list[int]:
    """The prompt's ids as the gateway gets them: rendered (within the character bound), tokenised, bounded."""
    runner = runner_for(model)
    ids = model.tokenizer.encode(runner.render(call).text)
    runner.check_prompt(ids)
    return ids


def refused(error: pytest.ExceptionInfo[BadRequest], message: str) -> None:
    assert error.value.code == "context_length_exceeded" and error.value.param == "messages"
    assert message in error.value.message, error.value.message


class Guarded:
    """A tokenizer of which only the ``allowed`` methods may be used: refusing a prompt from its length in characters
    needs no tokenising (and, from the text of its messages, no rendering either)."""

    def __init__(self, tokenizer: Tokenizer, *allowed: str) -> None:
        self.tokenizer = tokenizer
        self.allowed = allowed

    def __getattr__(self, name: str) -> object:
        if name not in self.allowed:
            raise AssertionError(f"the tokenizer was used ({name}) to refuse a prompt its length alone refuses")
        return getattr(self.tokenizer, name)


def guarded(model: ModelInfo, *allowed: str) -> ModelInfo:
    return ModelInfo(Guarded(model.tokenizer, *allowed), model.context_length, model.model_id,  # type: ignore[arg-type]
                     model.chars_per_token)


def test_a_200k_token_prompt_fits_a_256k_window(long_model):
    assert long_model.context_length == LONG_CONTEXT and long_model.chars_per_token == len(LONGEST_PIECE)
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(52_000))        # a tool transcript's worth of words
    call, _ = prepare_call(chat_body([user(text)]), None, long_model.vocab_size, long_model.limits)
    assert 200_000 <= len(prompt_ids(long_model, call)) < LONG_CONTEXT
    # the longest prompt that fits: one token per piece, one position left to generate in, and 4 MB of text
    markup = len(long_model.tokenizer.encode(TOK.render_chat([user("")], add_generation_prompt=True)))
    fits = LONGEST_PIECE * (LONG_CONTEXT - 1 - markup)
    call, _ = prepare_call(chat_body([user(fits)], max_tokens=1), None, long_model.vocab_size, long_model.limits)
    assert len(fits) > 4 * 10**6 and len(prompt_ids(long_model, call)) == LONG_CONTEXT - 1
    call, _ = prepare_call(chat_body([user(fits + LONGEST_PIECE)]), None, long_model.vocab_size, long_model.limits)
    with pytest.raises(BadRequest) as error:                          # one token more: no room to generate
        prompt_ids(long_model, call)
    refused(error, f"the model's context is {LONG_CONTEXT} tokens")


def test_a_prompt_past_a_256k_window_is_refused_before_it_is_rendered_or_tokenised(long_model):
    limits = long_model.limits
    assert limits.max_prompt_chars == (LONG_CONTEXT - 1) * len(LONGEST_PIECE)
    over = "word " * (limits.max_prompt_chars // 5 + 2)              # 4.2 MB: more characters than 256k tokens cover
    half = len(over) // 2
    for messages in ([user(over)], [{"role": "system", "content": over[:half]}, user(over[half:])]):
        with pytest.raises(BadRequest) as error:                      # the HTTP front end, decoding the body
            prepare_call(chat_body(messages), None, long_model.vocab_size, limits)
        refused(error, "the text of the messages has")
        with pytest.raises(BadRequest) as error:                      # both front ends, before rendering
            runner_for(guarded(long_model)).render(ChatCall(messages=messages))
        refused(error, "the text of the messages has")
    # assistant turns are not counted before rendering (a template may drop them): the rendering stops instead
    history = [user("hi"), {"role": "assistant", "content": "x" * (limits.max_prompt_chars + 1)}, user("and?")]
    call, _ = prepare_call(chat_body(history), None, long_model.vocab_size, limits)
    with pytest.raises(BadRequest) as error:
        runner_for(guarded(long_model, "render_chat")).render(call)
    refused(error, "the prompt has at least")


def test_generation_limits_against_a_256k_window(long_model):
    def parse(**fields: object) -> ChatCall:
        body = json.dumps({"model": "forge-tiny", "messages": [user("hi")], **fields}).encode()
        return prepare_call(body, None, long_model.vocab_size, long_model.limits)[0]

    most = LONG_CONTEXT - 1
    sampling = parse(max_tokens=most, min_tokens=most).sampling
    assert sampling.max_tokens == sampling.min_tokens == most
    for field in ("max_tokens", "min_tokens"):
        with pytest.raises(BadRequest) as error:
            parse(**{field: LONG_CONTEXT})
        assert error.value.code == "context_length_exceeded" and error.value.param == field
