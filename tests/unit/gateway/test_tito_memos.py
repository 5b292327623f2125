"""How the gateway holds a session's calls for token-in-token-out splicing (``forge.gateway.tito``): a call that
extends the previous one keeps only its new ids and the text they add, and still gives exactly the whole ids and
``decode`` of them, for a byte-level tokenizer (windowed decoding), a SentencePiece-style one (``Metaspace``,
windowed) and a Llama-2-style one (byte fallback: whole decoding), on random sessions of random ids; and the prompts
built from such a history are the ones a history of whole calls gives."""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from forge.assets import TINY_DIR
from forge.gateway.tito import (
    FALLBACK,
    PARTIAL,
    SPLICE,
    WINDOW,
    CallHistory,
    common_prefix_len,
    decodes_locally,
)
from forge.tokenizer import Tokenizer

from conftest import REPO

CORPUS = ["the quick brown fox jumps over the lazy dog", "naïve café: 3 € and 5 ¥ — déjà vu", "日本語のテキスト と 漢字",
          "emoji 😀🎉 and  double  spaces\nnew lines\ttabs", "<tool_call>{\"name\": \"add\"}</tool_call>"] * 20


def _metaspace() -> Tokenizer:
    backend = HFTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"]))
    return Tokenizer(backend)


def _byte_fallback() -> Tokenizer:
    """As Llama 2 and Mistral: spaces as ▁, unknown characters as byte tokens, a decoder sequence."""
    backend = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<eos>", *(f"<0x{b:02X}>" for b in range(256))]
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials))
    return Tokenizer(backend)


TOKENIZERS = {"byte-level": lambda: Tokenizer.from_dir(TINY_DIR), "metaspace": _metaspace,
              "byte-fallback": _byte_fallback}
LOADED: dict[str, Tokenizer] = {}


def tokenizer(name: str) -> Tokenizer:
    if name not in LOADED:
        LOADED[name] = TOKENIZERS[name]()
    return LOADED[name]


def test_which_decoders_are_decoded_by_window():
    assert [decodes_locally(tokenizer(n)) for n in TOKENIZERS] == [True, True, False]


def random_session(rng: random.Random, vocab: int, calls: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) of each call: most extend the previous call's whole ids, some rewrite or cut them."""
    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    session, whole = [], []
    for _ in range(calls):
        kind = rng.choice(["extend", "extend", "extend", "same", "rewrite", "cut"]) if whole else "new"
        prompt = {"new": ids(rng.randrange(1, 40)), "extend": whole + ids(rng.randrange(0, 12)), "same": whole,
                  "rewrite": ids(rng.randrange(1, 40)) + whole[3:], "cut": whole[:max(1, len(whole) // 2)]}[kind]
        completion = ids(rng.randrange(0, 10))
        session.append((prompt, completion))
        whole = prompt + completion
    return session


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_held_calls_give_their_whole_ids_and_text(name, seed):
    tok, rng = tokenizer(name), random.Random(seed)
    history = CallHistory(max_calls=rng.choice([2, 64]))
    session = random_session(rng, tok.vocab_size, rng.randrange(1, 12))
    previous, before = None, []
    for index, (prompt, completion) in enumerate(session):
        history.add(index, prompt, completion)
        memo = history.calls[index]
        extends = bool(before) and prompt[:len(before)] == before
        assert (previous is not None and memo.line is previous.line) == extends     # an extension shares its ids
        assert memo.start == (len(before) if extends else 0)
        assert len(memo.own) == len(prompt) + len(completion) - (len(before) if extends else 0)
        previous, before = memo, prompt + completion
    order = list(history.calls.values())
    rng.shuffle(order)                          # texts are asked for in any order, not only oldest first
    for memo in order:
        prompt, completion = session[memo.index]
        assert memo.ids().tolist() == prompt + completion and memo.prompt_len == len(prompt)
        whole = tok.decode(prompt + completion)
        assert memo.text(tok) == whole and memo.text_len(tok) == len(whole)


def reference_build(tok: Tokenizer, session: list[tuple[list[int], list[int]]], text: str):
    """The prompt a history holding each call whole (decoded whole) gives: what ``CallHistory.build`` must give."""
    wholes = [(k, p + c, len(p), tok.decode(p + c)) for k, (p, c) in enumerate(session)]
    matching = [w for w in wholes if text.startswith(w[3])]
    if matching:
        _, ids, _, decoded = max(matching, key=lambda w: len(w[3]))
        return SPLICE, ids + tok.encode(text[len(decoded):])
    _, ids, prompt_len, _ = max(wholes, key=lambda w: common_prefix_len(text, w[3]))
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if text.startswith(tok.decode(ids[:mid])) else (lo, mid - 1)
    if lo <= prompt_len:
        return FALLBACK, tok.encode(text)
    return PARTIAL, ids[:lo] + tok.encode(text[len(tok.decode(ids[:lo])):])


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_prompts_built_from_held_calls_are_those_of_whole_calls(name, seed):
    tok, rng = tokenizer(name), random.Random(seed)
    session = random_session(rng, tok.vocab_size, rng.randrange(1, 8))
    history = CallHistory()
    history.extend((k, p, c) for k, (p, c) in enumerate(session))
    for _ in range(4):
        k = rng.randrange(len(session))
        decoded = tok.decode(session[k][0] + session[k][1])
        text = decoded[:rng.randrange(len(decoded) + 1)] if rng.random() < 0.3 else decoded
        text += rng.choice(["", " next turn", "<eos> user: ok", "ü€😀"])
        built = history.build(tok, text)
        kind, ids = reference_build(tok, session, text)
        assert (built.kind, built.ids) == (kind, ids)


def test_a_long_session_holds_its_context_once():
    tok, rng = tokenizer("byte-level"), random.Random(3)
    history, whole = CallHistory(), rng.choices(range(300), k=2000)
    for index in range(40):
        completion = rng.choices(range(300), k=50)
        history.add(index, whole, completion)
        last_whole = whole + completion
        whole = last_whole + rng.choices(range(300), k=20)
    last = history.calls[39]
    assert all(memo.line is last.line for memo in history.calls.values())
    assert last.length * 4 <= last.line.buffer.nbytes <= 2 * last.length * 4
    assert last.text(tok) == tok.decode(last.ids().tolist()) and np.array_equal(last.ids(), last_whole)


class CountingTokenizer:
    """A tokenizer that counts the ids it decodes."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner, self.backend, self.decoded = inner, inner.backend, 0

    def decode(self, ids: list[int]) -> str:
        self.decoded += len(ids)
        return self.inner.decode(ids)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)


@pytest.mark.parametrize("name", ["byte-level", "metaspace"])
def test_each_call_of_a_long_session_costs_its_new_tokens(name):
    """A chat session of 300 calls, each prompt the last call's text and a new turn: each call decodes only its new
    ids and a window before them, the history keeps only its calls (not every call since the session began), and
    every prompt is the splice a history of whole calls gives."""
    tok, rng = CountingTokenizer(tokenizer(name)), random.Random(5)
    words = CORPUS[0].split() + CORPUS[1].split()

    def sentence() -> list[int]:
        return tok.inner.encode(" " + " ".join(rng.choices(words, k=6)))

    history, ids, held = CallHistory(max_calls=8), sentence(), []
    for index in range(300):
        text = tok.inner.decode(ids) + " next turn"
        tok.decoded = 0
        built = history.build(tok, text)
        if index:
            assert built.kind == SPLICE and built.ids == ids + tok.inner.encode(text[len(tok.inner.decode(ids)):])
        if index > 1:               # the first call is decoded whole; each later one, its new ids and a window
            added = history.calls[index - 1].length - history.calls[index - 2].length
            assert tok.decoded <= 2 * WINDOW + added, (index, tok.decoded, added)
        completion = sentence()
        history.add(index, built.ids, completion)
        held.append(weakref.ref(history.calls[index]))
        ids = built.ids + completion
    gc.collect()
    assert sum(ref() is not None for ref in held) == 8        # no chain back to the session's first call


def test_a_decoder_that_reads_across_tokens_is_decoded_whole():
    """Byte fallback decodes a run of byte tokens together, so a window that starts inside a run can see valid text
    where the whole call has none: such a decoder is never decoded by window."""
    tok = tokenizer("byte-fallback")
    byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in (0xE2, 0x41)}
    base, extension = [byte[0xE2]] + [byte[0x41]] * 8, [byte[0x41]]
    assert tok.decode(base + extension) == "\ufffd" * 10
    history = CallHistory()
    history.add(0, base, [])
    history.add(1, base + extension, [])
    assert history.calls[1].line is history.calls[0].line and history.calls[1].text(tok) == "\ufffd" * 10


def test_the_history_benchmark_splices_every_call_after_the_first():
    """``bench/tito_history.py``'s smallest run, as the benchmarks run it: counts, not times."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "tito_history.py"), "--calls", "20", "--window", "5",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert (result["calls"], result["splices"]) == (20, 19) and len(result["tito_ms"]) == 2
